# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's VAE decoder stage (`vae_decoder`): latents from a DiT stage that does not decode
(`dit.decode: false`) become images in a process of their own."""

from __future__ import annotations

import time

import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig, resolve_device
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.pipeline_loader import load_pipeline
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.latent_decoder import LatentDecoder
from vllm_omni.models.qwen_image.prompt import TEXT_ENCODER
from vllm_omni.models.qwen_image.runner import REFUSES


class VAEDecoderExecutor:
    """Decodes latents from a DiT stage into images, in a stage of its own: decoding is
    convolution-bound and scales poorly with threads, so a separate process decoding request
    k while the DiT denoises request k+1 uses the cores better than one process doing both.
    Runs whole requests (`fifo` scheduling), batching equal sizes."""

    def __init__(self, config: DiTConfig, cache: DiTCacheManager) -> None:
        self.config = config
        self.cache = cache
        self.device = resolve_device(config.device)
        self.pipe = load_pipeline(config, self.device, (*TEXT_ENCODER, "transformer"))
        self.decoder = LatentDecoder(self.pipe)

    @property
    def info(self) -> ImageStageInfo:
        return ImageStageInfo(
            self.decoder.default_size, self.decoder.size_multiple, refuses=REFUSES
        )

    def check_request(self, request: DiTRequest) -> None:
        if "latents" not in request.inputs:
            raise FieldError("inputs", "the VAE decoder stage needs 'latents'")

    def estimate_bytes(self, request: DiTRequest) -> int:
        return sum(t.numel() * t.element_size() for t in request.inputs.values())

    def stats(self) -> dict[str, int]:
        return {}

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        out = DiTRunnerOutput()
        for request_id in scheduled.new_request_ids:
            self.cache.allocate(request_id, requests[request_id].inputs)
        for group in scheduled.groups:
            start = time.perf_counter()
            batch = [requests[rid] for rid in group]
            if batch[0].params.output_type == "latent":
                out.finished.update({r.request_id: r.inputs["latents"] for r in batch})
            else:
                latents = torch.stack([r.inputs["latents"] for r in batch])
                p = batch[0].params
                images = self.decoder.decode(latents, p.height, p.width)
                out.finished.update({r.request_id: im for r, im in zip(batch, images)})
            out.step_seconds.append(time.perf_counter() - start)
        return out
