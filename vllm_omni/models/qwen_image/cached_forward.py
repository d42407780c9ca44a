# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's transformer forward, block by block, with per-request first-block residual
caching (the policy and per-request state: vllm_omni.diffusion.residual_cache)."""

from __future__ import annotations

import torch

from vllm_omni.diffusion.residual_cache import FirstBlockCache, RowGroup


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
        self.cache = FirstBlockCache()

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

        def tail(index: torch.Tensor | None) -> torch.Tensor:
            h, txt, mask, emb = first_out, text, text_mask, temb
            if index is not None:
                h, txt, emb = (x.index_select(0, index) for x in (first_out, text, temb))
                mask = None if text_mask is None else text_mask.index_select(0, index)
            for block in blocks[1:]:
                h, txt = run(block, h, txt, mask, emb)
            return h

        out = self.cache.run(hidden, first_out, groups, tail)
        out = t.norm_out(out, temb)
        return t.proj_out(out)
