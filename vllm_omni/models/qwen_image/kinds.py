# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's process-stage executors, as registered: `qwen_image` (the DiT on the framework's
step loop) and `vae_decoder` (the VAE alone, in a stage of its own)."""

from __future__ import annotations

from typing import Any

from vllm_omni.diffusion.executor_kind import ImageKind
from vllm_omni.diffusion.step_loop import StepwiseKind
from vllm_omni.models.qwen_image.prompt import TEXT_ENCODER


class QwenImageDiT(ImageKind, StepwiseKind):
    name = "qwen_image"
    residual_cache = True
    skip_components = TEXT_ENCODER

    def runner(self, pipe, config, device):
        from vllm_omni.models.qwen_image.runner import QwenImageRunner

        return QwenImageRunner(pipe, config, device)


class QwenImageVAEDecoder(ImageKind):
    name = "vae_decoder"
    whole_requests = True
    # VAE decoding barely scales with threads (measured: 41 vs 38 ms per 128x128 image on 1 vs
    # 2 threads); one thread leaves the other cores to the DiT, whose matmuls do scale. With
    # both on all cores, OpenMP threads spin against each other.
    cpu_defaults = {"num_threads": 1}

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.qwen_image.vae_decoder import VAEDecoderExecutor

        if pipe is not None:
            raise ValueError("pipe: the vae_decoder executor loads its own VAE")
        return VAEDecoderExecutor(config, cache)
