# SPDX-License-Identifier: Apache-2.0
"""Z-Image (diffusers `ZImagePipeline`): its Qwen3 text encoder on vLLM (up to the layer the
pipeline reads, text_encoder.py) -> the DiT, step-batched (runner.py)."""

from vllm_omni.models.z_image.encoder_config import ENCODER_ARCH
from vllm_omni.models.z_image.graph import stage_graph
from vllm_omni.models.z_image.kinds import ZImageDiT
from vllm_omni.models.z_image.prompt import prompt_encoder
from vllm_omni.models.z_image.tiny import build_z_image
from vllm_omni.registry import ModelFamily, TinyModel

FAMILY = ModelFamily(
    name="z_image",
    graph=stage_graph,
    pipeline_classes=("ZImagePipeline",),
    repos=("Tongyi-MAI/Z-Image-Turbo",),
    words=("z_image", "zimage"),
    processors={"z_image_prompt": prompt_encoder},
    executors=(ZImageDiT(),),
    vllm_models={ENCODER_ARCH: "vllm_omni.models.z_image.text_encoder:ZImageQwen3TextEncoder"},
    tiny_models={
        "z-image": TinyModel(build_z_image, ("Tongyi-MAI/Z-Image-Turbo",)),
    },
)
