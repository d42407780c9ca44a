# SPDX-License-Identifier: Apache-2.0
"""The executor that serves a whole diffusers pipeline, as registered: `diffusers_pipeline`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vllm_omni.diffusion.executor_kind import ImageKind, StageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams, check_input_images
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.info import PipelineStageInfo
from vllm_omni.models.diffusers_pipeline.signature import IMAGE_ARG


class WholePipelineKind(ImageKind):
    """Requests run whole (`fifo`): those sharing size, steps and guidance go into one call;
    a request with input images (an editing pipeline's) runs in a call of its own."""

    name = "diffusers_pipeline"
    whole_requests = True
    request_options = ("negative_prompt", IMAGE_ARG)

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.diffusers_pipeline.executor import WholePipelineExecutor

        return WholePipelineExecutor(config, cache, pipe)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        params = super().validate(params, stage, scheduler, info)
        if params.output_type != "pil":
            raise FieldError(
                "output_type",
                f"a pipeline served whole returns images ('pil'), not {params.output_type!r}",
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
            if edits:
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
