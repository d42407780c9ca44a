# SPDX-License-Identifier: Apache-2.0
"""Z-Image's DiT executor, as registered: `z_image` (the framework's step loop), and its request
parameters: Z-Image guides whenever `guidance_scale > 0`."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from vllm_omni.diffusion.executor_kind import ImageKind, StageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.step_loop import StepwiseKind

DEFAULT_GUIDANCE_SCALE = 5.0  # ZImagePipeline.__call__'s (Z-Image-Turbo's card uses 0)


@dataclass(frozen=True)
class ZImageSamplingParams(DiffusionSamplingParams):
    """An image request as Z-Image runs it: classifier-free guidance (a second row, against
    the negative prompt, empty if none) whenever `guidance_scale > 0`, as `ZImagePipeline`
    decides."""

    @property
    def do_cfg(self) -> bool:
        scale = DEFAULT_GUIDANCE_SCALE if self.guidance_scale is None else self.guidance_scale
        return scale > 0


class ZImageDiT(ImageKind, StepwiseKind):
    name = "z_image"
    skip_components = ("text_encoder", "tokenizer")  # the encoder stage's

    def runner(self, pipe, config, device):
        from vllm_omni.models.z_image.runner import ZImageRunner

        return ZImageRunner(pipe, device)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        """As any image stage's, with the pipeline's guidance scale where none is given."""
        params = super().validate(params, stage, scheduler, info)
        if params.guidance_scale is None:
            params = replace(params, guidance_scale=DEFAULT_GUIDANCE_SCALE)
        return ZImageSamplingParams(**{f.name: getattr(params, f.name) for f in fields(params)})

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        # Guidance needs a negative prompt: the pipeline's is empty.
        return {"negative_prompt": params.negative_prompt or ""} if params.do_cfg else {}
