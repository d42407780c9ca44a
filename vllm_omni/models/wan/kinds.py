# SPDX-License-Identifier: Apache-2.0
"""Wan's video executor, as registered: `wan` (step-batched; whole requests with `fifo`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from PIL import Image

from vllm_omni.diffusion.executor_kind import ExecutorKind, StageInfo, VideoStageInfo
from vllm_omni.diffusion.params import INPUT_IMAGES, check_cache_scheduler
from vllm_omni.diffusion.video_params import VideoSamplingParams, resolve
from vllm_omni.errors import FieldError


class WanVideo(ExecutorKind):
    name = "wan"
    params_type = VideoSamplingParams
    residual_cache = True
    request_options = ("negative_prompt", INPUT_IMAGES)

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.wan.executor import WanExecutor

        return WanExecutor(config, cache, pipe)

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        """The negative prompt; image-to-video's first frame, which it needs (one image)."""
        assert isinstance(info, VideoStageInfo), info
        params = params or VideoSamplingParams()
        negative = inputs.get("negative_prompt")
        if negative is not None and isinstance(params, VideoSamplingParams):
            params = replace(params, negative_prompt=negative)
        image = inputs.get(INPUT_IMAGES)
        if image is None:
            if info.image_to_video:
                raise FieldError(
                    INPUT_IMAGES, f"{info.pipeline_class} animates an image: give the first frame"
                )
            return params
        if not info.image_to_video:
            raise FieldError(INPUT_IMAGES, f"{info.pipeline_class} takes no input image")
        images = image if isinstance(image, list) else [image]
        if len(images) != 1 or not isinstance(images[0], Image.Image):
            raise FieldError(INPUT_IMAGES, "must be one PIL image (the first frame)")
        return params

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        assert isinstance(info, VideoStageInfo), info
        params = resolve(params, stage, info.default_shape, info.size_multiple)
        check_cache_scheduler(params.cache_threshold, stage, scheduler)
        if params.guidance_scale_2 is not None and not info.two_experts:
            raise FieldError(
                "guidance_scale_2",
                f"{info.pipeline_class} has one transformer; guidance_scale_2 is the second "
                "expert's (a two-expert Wan2.2 pipeline's)",
            )
        return params

    def outputs(self, result: Any, info: StageInfo) -> dict[str, Any]:
        return {"video": result["video"], "fps": result["fps"]}
