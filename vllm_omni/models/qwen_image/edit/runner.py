# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit's model code for the step loop: Qwen-Image's runner with the input images as
conditioning latents (vllm_omni.models.qwen_image.edit.conditioning)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.models.qwen_image.edit.conditioning import EditConditioning
from vllm_omni.models.qwen_image.runner import REFUSES, QwenImageRunner

CONDITIONING = {
    "QwenImageEditPipeline": EditConditioning(takes_list=False, max_images=1),
    "QwenImageEditPlusPipeline": EditConditioning(takes_list=True, max_images=3),
}
"""The editing pipelines this runner serves, and how each takes its input images (Edit-Plus:
one to three, its model card says)."""


@dataclass(frozen=True)
class EditStageInfo(ImageStageInfo):
    """An edit stage, with its pipeline class (for errors)."""

    pipeline_class: str


class EditRunner(QwenImageRunner):
    def __init__(self, pipe, config: DiTConfig, device: torch.device) -> None:
        name = type(pipe).__name__
        if name not in CONDITIONING:
            raise ValueError(
                f"executor: the qwen_image_edit executor runs {sorted(CONDITIONING)}, not {name}"
            )
        super().__init__(pipe, config, device, CONDITIONING[name])

    @property
    def info(self) -> EditStageInfo:
        return EditStageInfo(
            self.decoder.default_size,
            self.decoder.size_multiple,
            refuses=REFUSES,
            pipeline_class=type(self.pipe).__name__,
            max_input_images=self.conditioning.max_images,
        )
