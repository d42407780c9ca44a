# SPDX-License-Identifier: Apache-2.0
"""Several callers' denoiser calls as one: which calls join, how their arguments are joined and
the output split, for argument layouts diffusers' denoisers take."""

from __future__ import annotations

import torch
from diffusers.models.modeling_outputs import Transformer2DModelOutput

from vllm_omni.diffusion.batched_calls import Call, Failed, join, partition, run_batched, split


def flux_like(rows: int, seq: int = 16, text: int = 8, t: float = 0.5) -> Call:
    """Batched latents, text and timesteps; position ids shared (sequence length first)."""
    return Call(
        (),
        {
            "hidden_states": torch.randn(rows, seq, 4),
            "timestep": torch.full((rows,), t),
            "encoder_hidden_states": torch.randn(rows, text, 4),
            "img_ids": torch.arange(seq * 3.0).reshape(seq, 3),
            "joint_attention_kwargs": None,
            "return_dict": False,
        },
    )


def test_calls_that_line_up_are_one_call_and_each_gets_its_rows():
    calls = [flux_like(1, t=0.75), flux_like(2, t=0.25), flux_like(1, t=0.125)]
    seen = []

    def denoiser(hidden_states, timestep, encoder_hidden_states, img_ids, **kwargs):
        seen.append((hidden_states.shape[0], img_ids.shape, kwargs))
        assert timestep.tolist() == [0.75, 0.25, 0.25, 0.125]
        return (hidden_states * 2 + timestep[:, None, None],)

    outputs = run_batched(denoiser, calls)
    assert seen == [(4, (16, 3), {"joint_attention_kwargs": None, "return_dict": False})]
    for call, (out,) in zip(calls, outputs):
        kw = call.kwargs
        torch.testing.assert_close(out, kw["hidden_states"] * 2 + kw["timestep"][:, None, None])


def test_calls_that_differ_in_shape_or_options_are_separate_calls():
    a, b = flux_like(1), flux_like(1, seq=32)  # another latent size
    c, d = flux_like(1, text=12), flux_like(1)  # another text length; one like `a`
    e = flux_like(1)
    e.kwargs["joint_attention_kwargs"] = {"scale": 0.5}
    f = flux_like(1)
    f.kwargs["img_ids"] = f.kwargs["img_ids"] + 1  # other shared values
    batches = partition([a, b, c, d, e, f])
    assert [batch.members for batch in batches] == [[0, 3], [1], [2], [4], [5]]


def test_scalar_timesteps_that_differ_are_expanded_to_the_rows():
    calls = [Call((torch.zeros(2, 3), torch.tensor(t)), {}) for t in (1.0, 7.0)]
    (batch,) = partition(calls)
    joint = join(calls, batch.joins)
    assert joint.args[1].tolist() == [1.0, 1.0, 7.0, 7.0]
    same = [Call((torch.zeros(1, 3), torch.tensor(4.0)), {}) for _ in range(2)]
    (batch,) = partition(same)
    assert join(same, batch.joins).args[1].dim() == 0  # equal: passed once, as it was


def test_one_element_timesteps_beside_guidance_rows_are_expanded_too():
    # Stable Audio passes `t.unsqueeze(0)`, shape (1,), beside two guidance rows (one row
    # without guidance, where (1,) is that row's own).
    calls = [Call((torch.zeros(r, 3), torch.tensor([t])), {}) for r, t in ((2, 1.0), (1, 7.0))]
    (batch,) = partition(calls)
    assert join(calls, batch.joins).args[1].tolist() == [1.0, 1.0, 7.0]
    longer = [Call((torch.zeros(3, 3), torch.tensor([t, t])), {}) for t in (1.0, 7.0)]
    assert len(partition(longer)) == 2  # two values for three rows: neither per row nor one


def test_lists_as_long_as_the_rows_are_batched():
    calls = [Call((torch.zeros(r, 2),), {"img_shapes": [(1, r)] * r}) for r in (1, 2)]
    (batch,) = partition(calls)
    assert join(calls, batch.joins).kwargs["img_shapes"] == [(1, 1), (1, 2), (1, 2)]


def test_outputs_are_split_inside_tuples_and_output_classes():
    joint = Transformer2DModelOutput(sample=torch.arange(6.0).reshape(3, 2))
    first, second = split(joint, [1, 2])
    assert isinstance(first, Transformer2DModelOutput)
    assert first.sample.tolist() == [[0.0, 1.0]]
    assert second.sample.shape == (2, 2)
    shared = torch.ones(5)  # not the joint rows: every caller gets it
    parts = split((torch.zeros(3, 1), shared), [2, 1])
    assert parts[0][0].shape == (2, 1) and parts[1][1] is shared


def test_per_image_lists_are_batched_and_split():
    """Z-Image's layout: latents a list of per-image tensors, output a tuple holding such a list."""
    calls = [Call(([torch.full((2, 3), float(r))] * r, torch.ones(r)), {}) for r in (1, 2)]
    (batch,) = partition(calls)
    joint = join(calls, batch.joins)
    assert len(joint.args[0]) == 3 and joint.args[1].shape == (3,)
    parts = split((joint.args[0],), [1, 2])
    assert [len(p[0]) for p in parts] == [1, 2] and parts[1][0][0][0, 0] == 2.0


def test_a_joint_call_that_raises_is_run_call_by_call():
    """Flux's position ids of a one-token image look batched in one-row calls: joined, the
    forward raises, and each call runs alone; a call that fails alone gets its error."""
    calls = [Call((torch.zeros(1, 1, 4),), {"img_ids": torch.zeros(1, 3)}) for _ in range(2)]
    calls.append(Call((torch.full((1, 1, 4), -1.0),), {"img_ids": torch.zeros(1, 3)}))

    def denoiser(hidden_states, img_ids):
        if img_ids.shape[0] != hidden_states.shape[1]:
            raise RuntimeError("ids do not fit the tokens")
        if hidden_states.min() < 0:
            raise ValueError("negative latents")
        return hidden_states + 1

    outputs = run_batched(denoiser, calls)
    assert [o.tolist() for o in outputs[:2]] == [[[[1.0] * 4]]] * 2
    assert isinstance(outputs[2], Failed) and "negative" in str(outputs[2].error)


def test_a_tuple_is_one_value_whatever_its_length():
    """A rotary (cos, sin) pair beside two guided rows is shared, not split per row."""
    rotary = (torch.ones(4, 2), torch.zeros(4, 2))
    calls = [Call((torch.zeros(2, 4, 2),), {"image_rotary_emb": rotary}) for _ in range(2)]
    (batch,) = partition(calls)
    assert join(calls, batch.joins).kwargs["image_rotary_emb"] is rotary
