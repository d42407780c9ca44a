# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit's executor, as registered: `qwen_image_edit` (the DiT, step-batched, with the
input images as conditioning latents)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vllm_omni.diffusion.executor_kind import StageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams, check_input_images
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.edit.conditioning import VAE_AREA, area_size
from vllm_omni.models.qwen_image.edit.prompt import IMAGE_ARG
from vllm_omni.models.qwen_image.kinds import QwenImageDiT
from vllm_omni.models.qwen_image.prompt import TEXT_ENCODER


class QwenImageEditDiT(QwenImageDiT):
    name = "qwen_image_edit"
    request_options = ("negative_prompt", IMAGE_ARG)

    skip_components = (*TEXT_ENCODER, "processor")  # the encoder stage's

    def runner(self, pipe, config, device):
        from vllm_omni.models.qwen_image.edit.runner import EditRunner

        return EditRunner(pipe, config, device)

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        """The negative prompt and the input images, checked; where the request gives no
        size, the pipelines' own: the last image's aspect at about 1024x1024."""
        from vllm_omni.models.qwen_image.edit.runner import EditStageInfo

        assert isinstance(info, EditStageInfo), info
        params = super().apply_options(params, inputs, info) or DiffusionSamplingParams()
        if inputs.get(IMAGE_ARG) is None:
            raise FieldError(IMAGE_ARG, f"{info.pipeline_class} edits an image: give one")
        images = check_input_images(inputs[IMAGE_ARG], info.pipeline_class, info.max_input_images)
        height, width = area_size(VAE_AREA, images[-1].size)
        multiple = info.size_multiple
        return replace(
            params,
            height=params.height or height // multiple * multiple,
            width=params.width or width // multiple * multiple,
        )
