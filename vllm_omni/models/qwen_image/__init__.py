# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image (diffusers `QwenImagePipeline`): a Qwen2.5-VL text encoder on vLLM -> the DiT."""

from vllm_omni.models.qwen_image.graph import stage_graph
from vllm_omni.models.registry import ModelFamily

FAMILY = ModelFamily(
    name="qwen_image",
    graph=stage_graph,
    pipeline_classes=("QwenImagePipeline",),
    repos=("Qwen/Qwen-Image",),
)
