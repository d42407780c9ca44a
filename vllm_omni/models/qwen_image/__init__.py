# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image (diffusers `QwenImagePipeline`): a Qwen2.5-VL text encoder on vLLM -> the DiT."""

from vllm_omni.models.qwen_image.graph import stage_graph
from vllm_omni.models.qwen_image.kinds import QwenImageDiT, QwenImageVAEDecoder
from vllm_omni.models.qwen_image.prompt import prompt_encoder
from vllm_omni.models.qwen_image.tiny import build_qwen_image
from vllm_omni.registry import ModelFamily, TinyModel


def _pinned() -> list:
    from vllm_omni.models.qwen_image.vae_fast_path import pinned

    return pinned()


FAMILY = ModelFamily(
    name="qwen_image",
    graph=stage_graph,
    pipeline_classes=("QwenImagePipeline",),
    repos=("Qwen/Qwen-Image",),
    words=("qwen",),
    processors={"qwen_image_prompt": prompt_encoder},
    executors=(QwenImageDiT(), QwenImageVAEDecoder()),
    pinned=_pinned,
    tiny_models={
        "qwen-image": TinyModel(build_qwen_image, ("Qwen/Qwen-Image",)),
    },
)
