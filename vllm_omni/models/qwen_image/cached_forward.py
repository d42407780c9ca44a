# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's transformer forward, block by block, with per-request first-block residual
caching (the policy and per-request state: vllm_omni.diffusion.residual_cache)."""

from __future__ import annotations

import torch

from vllm_omni.diffusion.residual_cache import (
    CACHED_STEPS,
    CONSECUTIVE,
    FIRST_RESIDUAL,
    TAIL_RESIDUAL,
    RowGroup,
)


def supports(transformer) -> bool:
    """Whether `FirstBlockCachedForward` knows this transformer's forward: Qwen-Image's
    dual-stream blocks, without the edit-model extras."""
    needed = ("img_in", "txt_norm", "txt_in", "time_text_embed", "pos_embed", "norm_out")
    config = getattr(transformer, "config", None)
    return (
        config is not None
        and all(hasattr(transformer, name) for name in (*needed, "proj_out", "transformer_blocks"))
        and len(transformer.transformer_blocks) >= 2
        and not config.get("zero_cond_t", False)
        and not config.get("use_additional_t_cond", False)
        and not config.get("guidance_embeds", False)
    )


class FirstBlockCachedForward:
    """The transformer's forward, block by block, with per-request first-block caching.

    With every request computing, it performs exactly the operations of the transformer's own
    forward (tests/models/qwen_image/test_residual_cache.py checks the outputs are equal)."""

    def __init__(self, transformer) -> None:
        if not supports(transformer):
            raise ValueError(
                f"dit.residual_cache: {type(transformer).__name__} is not supported (Qwen-Image "
                "transformers without zero_cond_t / additional_t_cond / guidance embeddings are)"
            )
        self.transformer = transformer
        self.num_computed_rows = 0  # row-steps through every block
        self.num_cached_rows = 0  # row-steps served from the cache

    def __call__(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None,
        img_shapes: list,
        groups: list[RowGroup],
    ) -> torch.Tensor:
        from diffusers.models.transformers.transformer_qwenimage import (
            compute_text_seq_len_from_mask,
        )

        t = self.transformer
        hidden = t.img_in(latents)
        timestep = timestep.to(hidden.dtype)
        text = t.txt_in(t.txt_norm(text))
        text_len, _, text_mask = compute_text_seq_len_from_mask(text, text_mask)
        temb = t.time_text_embed(timestep, hidden, None)
        rope = t.pos_embed(img_shapes, max_txt_seq_len=text_len, device=hidden.device)
        blocks = t.transformer_blocks

        def run(block, h, txt, mask, emb):
            txt, h = block(
                hidden_states=h,
                encoder_hidden_states=txt,
                encoder_hidden_states_mask=mask,
                temb=emb,
                image_rotary_emb=rope,
                joint_attention_kwargs=None,
                modulate_index=None,
            )
            return h, txt

        first_out, text = run(blocks[0], hidden, text, text_mask, temb)
        first = first_out - hidden
        compute = self._decide(first, groups)
        rows = [r for g, c in zip(groups, compute) if c for r in range(g.start, g.stop)]
        if len(rows) == first_out.shape[0]:  # nothing cached: the plain forward
            h = first_out
            for block in blocks[1:]:
                h, text = run(block, h, text, text_mask, temb)
            out = h
        else:
            out = first_out.clone()
            if rows:
                index = torch.tensor(rows, device=hidden.device)
                sub_first = first_out.index_select(0, index)
                h, txt = sub_first, text.index_select(0, index)
                mask = None if text_mask is None else text_mask.index_select(0, index)
                emb = temb.index_select(0, index)
                for block in blocks[1:]:
                    h, txt = run(block, h, txt, mask, emb)
                out.index_copy_(0, index, h)
        for group, computes in zip(groups, compute):
            rows_of = slice(group.start, group.stop)
            if computes:
                self.num_computed_rows += group.stop - group.start
                group.entry.state[CONSECUTIVE] = 0
                if group.keeps_state():
                    tail = out[rows_of] - first_out[rows_of]
                    group.entry.tensors[FIRST_RESIDUAL] = first[rows_of].clone()
                    group.entry.tensors[TAIL_RESIDUAL] = tail
            else:
                self.num_cached_rows += group.stop - group.start
                out[rows_of] = first_out[rows_of] + group.entry.tensors[TAIL_RESIDUAL]
                group.entry.state[CONSECUTIVE] = group.entry.state.get(CONSECUTIVE, 0) + 1
                group.entry.state[CACHED_STEPS] = group.entry.state.get(CACHED_STEPS, 0) + 1
        out = t.norm_out(out, temb)
        return t.proj_out(out)

    def _decide(self, first: torch.Tensor, groups: list[RowGroup]) -> list[bool]:
        """Per group: whether it runs the remaining blocks. One host sync for all distances."""
        compute = [g.must_compute() for g in groups]
        candidates = [i for i, c in enumerate(compute) if not c]
        if not candidates:
            return compute
        distances = []
        for i in candidates:
            g = groups[i]
            previous = g.entry.tensors[FIRST_RESIDUAL]
            current = first[g.start : g.stop]
            # per row, then the larger of a request's rows (guidance rows decide together)
            change = (current - previous).abs().flatten(1).mean(1)
            scale = previous.abs().flatten(1).mean(1).clamp_min(1e-12)
            distances.append((change / scale).max())
        for i, distance in zip(candidates, torch.stack(distances).tolist()):
            compute[i] = distance >= groups[i].policy.threshold
        return compute
