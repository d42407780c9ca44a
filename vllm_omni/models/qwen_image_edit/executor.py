# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit's DiT stage: Qwen-Image's step-batched executor with the input images as
conditioning latents (vllm_omni.models.qwen_image_edit.conditioning)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.models.qwen_image.executors import (
    REFUSES,
    TEXT_ENCODER,
    DiffusersPipelineExecutor,
)
from vllm_omni.models.qwen_image_edit.conditioning import EditConditioning, as_pil
from vllm_omni.models.qwen_image_edit.prompt import IMAGE_ARG

CONDITIONING = {
    "QwenImageEditPipeline": EditConditioning(takes_list=False, max_images=1),
    "QwenImageEditPlusPipeline": EditConditioning(takes_list=True, max_images=3),
}
"""The editing pipelines this executor runs, and how each takes its input images (Edit-Plus:
one to three, its model card says)."""


@dataclass(frozen=True)
class EditStageInfo(ImageStageInfo):
    """An edit stage, with its pipeline class (for errors)."""

    pipeline_class: str


class EditPipelineExecutor(DiffusersPipelineExecutor):
    skip_components = (*TEXT_ENCODER, "processor")  # the encoder stage's

    def conditioning(self, pipe) -> EditConditioning:
        name = type(pipe).__name__
        if name not in CONDITIONING:
            raise ValueError(
                f"executor: the qwen_image_edit executor runs {sorted(CONDITIONING)}, not {name}"
            )
        return CONDITIONING[name]

    @property
    def info(self) -> EditStageInfo:
        decoder = self.model_runner.decoder
        return EditStageInfo(
            decoder.default_size,
            decoder.size_multiple,
            refuses=REFUSES,
            pipeline_class=type(self.pipe).__name__,
            max_input_images=self.model_runner.conditioning.max_images,
        )

    @torch.inference_mode()
    def _run_pipeline(self, requests: list[DiTRequest], **extra) -> dict[str, object]:
        """Whole pipeline calls (`fifo`): one edit per call, as the editing pipelines take a
        list of images as one edit's (Edit-Plus) or as a batch (Edit)."""
        out: dict[str, object] = {}
        takes_list = self.model_runner.conditioning.takes_list
        for request in requests:
            images = [as_pil(image) for image in request.inputs[IMAGE_ARG]]
            given = images if takes_list else images[0]
            out.update(super()._run_pipeline([request], image=given, **extra))
        return out
