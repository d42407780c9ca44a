# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit's executor, as registered: `qwen_image_edit` (the whole pipeline per edit)."""

from __future__ import annotations

from vllm_omni.models.diffusers_pipeline.kinds import WholePipelineKind


class QwenImageEditKind(WholePipelineKind):
    name = "qwen_image_edit"
    # Edit-Plus conditions one image on several (its model card: one to three); Edit takes one
    # (a list is a batch to it).
    max_input_images = {"QwenImageEditPlusPipeline": 3}
