# SPDX-License-Identifier: Apache-2.0
"""Wan text-to-video and image-to-video (diffusers `WanPipeline`, `WanImageToVideoPipeline`;
Wan2.1, and Wan2.2's two experts): one stage, the DiT step-batched across requests of one video
shape (runner.py), its UMT5 text encoder and VAE in the same process."""

from vllm_omni.models.wan.graph import stage_graph
from vllm_omni.models.wan.kinds import WanVideo
from vllm_omni.models.wan.tiny import build_wan22_t2v, build_wan_i2v, build_wan_t2v
from vllm_omni.registry import ModelFamily, TinyModel


def _pinned() -> list:
    from vllm_omni.models.wan import cached_forward, prompt, vae_norm

    return cached_forward.pinned() + prompt.pinned() + vae_norm.pinned()


FAMILY = ModelFamily(
    name="wan",
    graph=stage_graph,
    pipeline_classes=("WanPipeline", "WanImageToVideoPipeline"),
    repos=(
        "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
        "Wan-AI/Wan2.1-T2V-14B-Diffusers",
        "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
        "Wan-AI/Wan2.2-T2V-A14B-Diffusers",
        "Wan-AI/Wan2.2-I2V-A14B-Diffusers",
    ),
    words=("wan",),
    executors=(WanVideo(),),
    pinned=_pinned,
    tiny_models={
        "wan2.1-t2v": TinyModel(build_wan_t2v, ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",)),
        "wan2.2-t2v": TinyModel(build_wan22_t2v, ("Wan-AI/Wan2.2-T2V-A14B-Diffusers",)),
        "wan2.1-i2v": TinyModel(build_wan_i2v, ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",)),
    },
)
