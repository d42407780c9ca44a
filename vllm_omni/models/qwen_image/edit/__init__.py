# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit (diffusers `QwenImageEditPipeline`): Qwen2.5-VL reading the prompt with the
input image on vLLM -> the DiT, step-batched, conditioned on the image's VAE latents. Edit-Plus
(several input images) is a family of its own (vllm_omni.models.qwen_image.edit_plus) on the
same executor."""

from vllm_omni.models.qwen_image.edit.graph import edit_graph
from vllm_omni.models.qwen_image.edit.kinds import QwenImageEditDiT
from vllm_omni.models.qwen_image.edit.prompt import edit_encoder
from vllm_omni.models.qwen_image.tiny import build_qwen_image_edit
from vllm_omni.registry import ModelFamily, TinyModel

FAMILY = ModelFamily(
    name="qwen_image_edit",
    graph=lambda: edit_graph("qwen_image_edit", "qwen_image_edit_prompt"),
    pipeline_classes=("QwenImageEditPipeline",),
    repos=("Qwen/Qwen-Image-Edit",),
    words=("qwen",),
    processors={"qwen_image_edit_prompt": edit_encoder},
    executors=(QwenImageEditDiT(),),
    tiny_models={
        "qwen-image-edit": TinyModel(build_qwen_image_edit, ("Qwen/Qwen-Image-Edit",)),
    },
)
