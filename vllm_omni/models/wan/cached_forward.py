# SPDX-License-Identifier: Apache-2.0
"""Wan's transformer forward, block by block, with per-request first-block residual caching
(the policy, the per-request state and the decision: vllm_omni.diffusion.residual_cache).

With every request computing it performs the operations of `WanTransformer3DModel.forward`
for one timestep per row (tests/models/wan/test_residual_cache.py checks the outputs are equal);
`pinned()` fails tests/test_patches.py when diffusers changes that forward."""

from __future__ import annotations

import torch

from vllm_omni.diffusion.residual_cache import FirstBlockCache, RowGroup


class WanCachedForward:
    def __init__(self, transformer) -> None:
        self.transformer = transformer
        self.cache = FirstBlockCache()

    def __call__(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: torch.Tensor,
        image: torch.Tensor | None,
        groups: list[RowGroup],
    ) -> torch.Tensor:
        t = self.transformer
        batch, _, frames, height, width = latents.shape
        p_t, p_h, p_w = t.config.patch_size
        rotary = t.rope(latents)
        hidden = t.patch_embedding(latents).flatten(2).transpose(1, 2).contiguous()
        temb, modulation, text, image = t.condition_embedder(timestep, text, image)
        modulation = modulation.unflatten(1, (6, -1))
        if image is not None:
            text = torch.concat([image, text], dim=1)
        blocks = t.blocks
        first_out = blocks[0](hidden, text, modulation, rotary)

        def tail(index: torch.Tensor | None) -> torch.Tensor:
            h, txt, mod = first_out, text, modulation
            if index is not None:
                h, txt, mod = (x.index_select(0, index) for x in (first_out, text, modulation))
            for block in blocks[1:]:
                h = block(h, txt, mod, rotary)
            return h

        out = self.cache.run(hidden, first_out, groups, tail)
        shift, scale = (t.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        out = (t.norm_out(out.float()) * (1 + scale) + shift).type_as(out)
        out = t.proj_out(out)
        out = out.reshape(batch, frames // p_t, height // p_h, width // p_w, p_t, p_h, p_w, -1)
        return out.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)


def pinned() -> list:
    from diffusers import WanTransformer3DModel

    from vllm_omni._patches import Pinned

    return [
        Pinned(
            WanTransformer3DModel,
            "forward",
            "9f81a7225288",
            "cached_forward.WanCachedForward makes the same calls (one timestep per row) with "
            "the first block apart, for per-request residual caching.",
        )
    ]
