# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit-Plus (diffusers `QwenImageEditPlusPipeline`): one edit conditioned on one to
three input images, each read by the encoder at about 384x384 and encoded by the VAE at about
1024x1024. Qwen-Image-Edit's stages (vllm_omni.models.qwen_image.edit) with its own prompt."""

from vllm_omni.models.qwen_image.edit.graph import edit_graph
from vllm_omni.models.qwen_image.edit.prompt import edit_plus_encoder
from vllm_omni.models.qwen_image.tiny import build_qwen_image_edit_plus
from vllm_omni.registry import ModelFamily, TinyModel

FAMILY = ModelFamily(
    name="qwen_image_edit_plus",
    graph=lambda: edit_graph("qwen_image_edit_plus", "qwen_image_edit_plus_prompt"),
    pipeline_classes=("QwenImageEditPlusPipeline",),
    repos=("Qwen/Qwen-Image-Edit-2509",),
    words=("qwen",),
    processors={"qwen_image_edit_plus_prompt": edit_plus_encoder},
    tiny_models={
        "qwen-image-edit-plus": TinyModel(
            build_qwen_image_edit_plus, ("Qwen/Qwen-Image-Edit-2509",)
        ),
    },
)
