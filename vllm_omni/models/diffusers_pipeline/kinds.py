# SPDX-License-Identifier: Apache-2.0
"""The executors that run a diffusers pipeline's own `__call__`, step-batched, as registered:
`diffusers_pipeline` (images), `diffusers_video_pipeline` (videos) and
`diffusers_audio_pipeline` (audio)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from vllm_omni.diffusion.call_loop import CallLoopExecutor
from vllm_omni.diffusion.config import resolve_device
from vllm_omni.diffusion.executor_kind import AudioKind, ImageKind, StageInfo, VideoKind
from vllm_omni.diffusion.params import DiffusionSamplingParams, check_input_images
from vllm_omni.diffusion.pipeline_loader import stage_pipeline
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.info import PipelineStageInfo
from vllm_omni.models.diffusers_pipeline.signature import IMAGE_ARG


def call_loop(config, cache, pipe: Any, calls: Callable[[Any], Any]) -> CallLoopExecutor:
    """A stage's executor: its pipeline (loaded as its config says, or `pipe` moved to its
    device) run by its own call per request, as `calls` (the pipeline -> its PipelineCalls)
    describes it."""
    pipe = stage_pipeline(config, resolve_device(config.device), pipe)
    return CallLoopExecutor(config, cache, calls(pipe))


class PipelineCallKind(ImageKind):
    """Each request runs the pipeline's own `__call__`; the framework's call loop batches the
    denoiser calls of the requests at a step (`step` scheduling: they join and leave at step
    boundaries) or runs groups of whole requests (`fifo`)."""

    name = "diffusers_pipeline"
    request_options = ("negative_prompt", IMAGE_ARG)

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.diffusers_pipeline.calls import ImagePipelineCalls

        return call_loop(config, cache, pipe, ImagePipelineCalls)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        params = super().validate(params, stage, scheduler, info)
        if params.output_type != "pil":
            raise FieldError(
                "output_type",
                f"a pipeline run by its own call returns images ('pil'), not "
                f"{params.output_type!r}",
            )
        return params

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        """The negative prompt; an editing pipeline's input images, checked, and where the
        request gives no size, the last image's aspect (as the editing pipelines take it) at the
        pipeline's default area."""
        assert isinstance(info, PipelineStageInfo), info
        params = super().apply_options(params, inputs, info) or DiffusionSamplingParams()
        images = inputs.get(IMAGE_ARG)
        edits = IMAGE_ARG in info.call_args
        if images is None:
            if info.needs_image:
                raise FieldError(IMAGE_ARG, f"{info.pipeline_class} edits an image: give one")
            return params
        if not edits:
            raise FieldError(IMAGE_ARG, f"{info.pipeline_class} takes no input image")
        images = check_input_images(images, info.pipeline_class, info.max_input_images)
        if params.height is None and params.width is None:
            height, width = edit_size(images[-1].size, info.default_size, info.size_multiple)
            params = replace(params, height=height, width=width)
        return params

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        return {}  # the pipeline encodes its prompts itself


def edit_size(
    image_size: tuple[int, int], default: tuple[int, int], multiple: int
) -> tuple[int, int]:
    """(height, width) of an edit: the input image's aspect ratio at the area of the pipeline's
    default size, each side a multiple of `multiple` (at least one)."""
    width, height = image_size
    scale = math.sqrt(default[0] * default[1] / (width * height))
    return tuple(
        max(multiple, round(side * scale / multiple) * multiple) for side in (height, width)
    )


class PipelineVideoKind(VideoKind):
    """A text-to-video pipeline run by its own `__call__` per request, step-batched by the
    framework's call loop as the image pipelines are."""

    name = "diffusers_video_pipeline"
    request_options = ("negative_prompt",)

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.diffusers_pipeline.video_calls import VideoPipelineCalls

        return call_loop(config, cache, pipe, VideoPipelineCalls)


class PipelineAudioKind(AudioKind):
    """A text-to-audio pipeline run by its own `__call__` per request, step-batched by the
    framework's call loop as the image pipelines are."""

    name = "diffusers_audio_pipeline"

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.diffusers_pipeline.audio_calls import AudioPipelineCalls

        return call_loop(config, cache, pipe, AudioPipelineCalls)
