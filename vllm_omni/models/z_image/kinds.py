# SPDX-License-Identifier: Apache-2.0
"""Z-Image's DiT executor, as registered: `z_image` (step-batched; whole requests with `fifo`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vllm_omni.diffusion.executor_kind import ImageKind, StageInfo

DEFAULT_GUIDANCE_SCALE = 5.0  # ZImagePipeline.__call__'s (Z-Image-Turbo's card uses 0)


class ZImageDiT(ImageKind):
    name = "z_image"

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.z_image.executor import ZImageExecutor

        return ZImageExecutor(config, cache, pipe)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        """As any image stage's, with the pipeline's guidance scale where none is given."""
        params = super().validate(params, stage, scheduler, info)
        if params.guidance_scale is None:
            params = replace(params, guidance_scale=DEFAULT_GUIDANCE_SCALE)
        return params

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        # Guidance (any scale above 0) needs a negative prompt: the pipeline's is empty.
        if params.guidance_scale > 0:
            return {"negative_prompt": params.negative_prompt or ""}
        return {}
