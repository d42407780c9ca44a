# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit (diffusers `QwenImageEditPipeline`) and Edit-Plus (`QwenImageEditPlusPipeline`,
several input images): served whole, one edit per pipeline call."""

from vllm_omni.models.qwen_image_edit.kinds import QwenImageEditKind
from vllm_omni.models.registry import ModelFamily


def _graph() -> dict:
    from vllm_omni.models.diffusers_pipeline.graph import whole_pipeline_graph

    return whole_pipeline_graph("qwen_image_edit", QwenImageEditKind.name)


FAMILY = ModelFamily(
    name="qwen_image_edit",
    graph=_graph,
    pipeline_classes=("QwenImageEditPipeline", "QwenImageEditPlusPipeline"),
    repos=("Qwen/Qwen-Image-Edit", "Qwen/Qwen-Image-Edit-2509"),
    executors=(QwenImageEditKind(),),
)
