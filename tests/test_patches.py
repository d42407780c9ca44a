# SPDX-License-Identifier: Apache-2.0
"""Every vLLM patch still matches the vLLM function it wraps, and takes effect."""

import pytest
import torch

from vllm_omni import _patches, plugin


@pytest.mark.parametrize("patch", _patches.all_patches(), ids=lambda p: p.name)
def test_patched_vllm_function_is_unchanged(patch):
    # Fails when vLLM changes under a patch: review the patch, then update its fingerprint.
    owner = getattr(patch.owner, "__qualname__", patch.owner.__name__)
    assert patch.current_fingerprint() == patch.fingerprint, (
        f"{owner}.{patch.attr} changed; review patch {patch.name}"
    )


@pytest.mark.parametrize("pinned", _patches.all_pinned(), ids=lambda p: p.attr)
def test_pinned_vllm_internal_is_unchanged(pinned):
    # Fails when vLLM changes a function vllm_omni wraps on its own instances: review `why`.
    assert pinned.current_fingerprint() == pinned.fingerprint, (
        f"{pinned.owner.__qualname__}.{pinned.attr} changed; {pinned.why}"
    )


def test_register_applies_every_patch_on_cpu():
    plugin.register()
    for patch in _patches.all_patches():
        assert patch.is_applied(), patch.name
        # Applying again is a no-op and keeps a single wrapper layer.
        assert patch.apply()
        assert not hasattr(patch.original(), "__vllm_omni_original__")
        assert patch._unwrapped().__vllm_omni_original__ is patch.original()


def test_cpu_pp_eager_buffer_is_allocated_on_non_first_rank(monkeypatch):
    from vllm.distributed import parallel_state

    class FakeModel:
        def make_empty_intermediate_tensors(self, batch_size, dtype, device):
            return {"hidden_states": torch.zeros(batch_size, 4, dtype=dtype, device=device)}

    class FakeRunner:
        intermediate_tensors = None
        model = FakeModel()
        max_num_tokens = 8
        device = torch.device("cpu")

        class model_config:  # noqa: N801
            dtype = torch.bfloat16

    calls = []
    load_model = _patches._wrap_cpu_load_model(lambda self: calls.append(self))

    class Rank:
        def __init__(self, first):
            self.is_first_rank = first

    runner = FakeRunner()
    monkeypatch.setattr(parallel_state, "get_pp_group", lambda: Rank(first=True))
    load_model(runner)
    assert calls == [runner] and runner.intermediate_tensors is None

    monkeypatch.setattr(parallel_state, "get_pp_group", lambda: Rank(first=False))
    load_model(runner)
    buffer = runner.intermediate_tensors["hidden_states"]
    assert buffer.shape == (8, 4) and buffer.dtype == torch.bfloat16


def test_cpp_deepens_the_batch_queue_only_for_cpp_engines():
    from types import SimpleNamespace

    from vllm.config import VllmConfig

    plugin.register()

    def config(pp, additional, async_scheduling=False):
        fake = SimpleNamespace(
            parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
            additional_config=additional,
            use_v2_model_runner=False,
        )
        return VllmConfig.max_concurrent_batches.fget(fake)

    assert config(2, {}) == 2  # plain vLLM: untouched
    assert config(2, {"cpp": {}}) == 3
    assert config(4, {"cpp": {"lookahead_steps": 0}}) == 4
    assert config(1, {"cpp": {}}) == 1
