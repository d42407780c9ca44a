# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's process-stage executors: the DiT (`diffusers`) and the VAE decoder (`vae_decoder`).

No workers and no RPC: the pipeline is loaded in the stage's own process, and `execute_model`
runs what the DiffusionScheduler scheduled - whole pipeline calls (`fifo` mode, diffusers' own
loop, from prompt embeddings) or single denoising steps through the DiffusionModelRunner (`step`
mode). The text encoder is not loaded: prompt embeddings arrive from the AR stage.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig, resolve_device
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.pipeline_loader import load_pipeline, stage_pipeline
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.diffusion.step_loop import execute_steps
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.latent_decoder import LatentDecoder
from vllm_omni.models.qwen_image.model_runner import (
    NEGATIVE_PROMPT_EMBEDS,
    PROMPT_EMBEDS,
    Conditioning,
    DiffusionModelRunner,
    as_batch,
    pad_text,
)

REFUSES = frozenset({"guidance_scale"})
"""Qwen-Image guides with a negative prompt and `true_cfg_scale`; it has no distilled guidance."""


TEXT_ENCODER = ("text_encoder", "tokenizer")
"""Components the DiT stage does not load: the prompt embeddings come from the AR stage."""


class DiffusersPipelineExecutor:
    """`pipe`: an already built pipeline to run instead of loading `config.model` (shapes
    with no folder on disk: benchmarks/gpu_check.py's full-size random transformer)."""

    skip_components: ClassVar[tuple[str, ...]] = TEXT_ENCODER
    """Pipeline components not loaded (another stage runs them)."""

    def __init__(self, config: DiTConfig, cache: DiTCacheManager, pipe=None) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.pipe = stage_pipeline(config, self.device, pipe, self.skip_components)
        self.model_runner = DiffusionModelRunner(
            self.pipe,
            cache,
            self.device,
            config.decode,
            config.residual_cache,
            self.conditioning(self.pipe),
        )

    def conditioning(self, pipe) -> Conditioning | None:
        """How the pipeline's input images condition the DiT (an editing family's)."""
        return None

    @property
    def info(self) -> ImageStageInfo:
        decoder = self.model_runner.decoder
        return ImageStageInfo(decoder.default_size, decoder.size_multiple, refuses=REFUSES)

    def estimate_bytes(self, request: DiTRequest) -> int:
        return self.model_runner.estimate_bytes(request)

    def check_request(self, request: DiTRequest) -> None:
        self.model_runner.policy(request.params)  # raises if the request's cache cannot run

    def stats(self) -> dict[str, int]:
        cached = self.model_runner.cached_forward
        if cached is None:
            return {}
        # Row-steps through every block / served by the residual cache.
        return {
            "residual_computed_rows": cached.cache.num_computed_rows,
            "residual_cached_rows": cached.cache.num_cached_rows,
        }

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        groups = [[requests[rid] for rid in group] for group in scheduled.groups]
        if scheduled.mode == "step":
            for request_id in scheduled.new_request_ids:
                self.model_runner.prepare(requests[request_id])
            finished, seconds, decode_seconds = execute_steps(self.model_runner, groups)
            return DiTRunnerOutput(finished, seconds, decode_seconds)
        out = DiTRunnerOutput()
        for request_id in scheduled.new_request_ids:  # held while the call runs, for accounting
            self.model_runner.cache.allocate(request_id, requests[request_id].inputs)
        for group in groups:
            start = time.perf_counter()
            out.finished.update(self._run_pipeline(group))
            out.step_seconds.append(time.perf_counter() - start)
        return out

    @torch.inference_mode()
    def _run_pipeline(self, requests: list[DiTRequest], **extra) -> dict[str, object]:
        """One diffusers call for requests sharing size, steps and guidance; `extra`: more
        arguments of the call."""
        p = requests[0].params
        kwargs = {}
        names = [PROMPT_EMBEDS] + ([NEGATIVE_PROMPT_EMBEDS] if p.do_cfg else [])
        for name in names:
            rows = [
                as_batch(r.inputs[name]).to(self.device, self.pipe.transformer.dtype)
                for r in requests
            ]
            text, mask = pad_text(rows)
            if mask is None:
                mask = torch.ones(text.shape[:2], dtype=torch.long, device=text.device)
            kwargs[name], kwargs[f"{name}_mask"] = text, mask.long()
        generators = [torch.Generator(device="cpu").manual_seed(r.params.seed) for r in requests]
        result = self.pipe(
            height=p.height,
            width=p.width,
            num_inference_steps=p.num_inference_steps,
            true_cfg_scale=p.true_cfg_scale if p.do_cfg else 1.0,
            generator=generators,
            output_type="latent" if p.output_type == "latent" or not self.config.decode else "pil",
            **kwargs,
            **extra,
        ).images
        if p.output_type == "latent" or not self.config.decode:
            return {r.request_id: result[i].detach().cpu() for i, r in enumerate(requests)}
        return {r.request_id: np.asarray(img) for r, img in zip(requests, result)}


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
