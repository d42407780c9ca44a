# SPDX-License-Identifier: Apache-2.0
"""Serves a whole diffusers pipeline in the stage process: each scheduled group of requests
(equal size, steps and guidance) is one pipeline call with one seeded generator per request,
so every image is the one the pipeline makes for that prompt and seed alone. A request with
input images (an editing pipeline's) is a call of its own: pipelines batch input images in ways
of their own."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from PIL import Image

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig, resolve_device
from vllm_omni.diffusion.pipeline_loader import stage_pipeline
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.info import PipelineStageInfo
from vllm_omni.models.diffusers_pipeline.signature import IMAGE_ARG, call_args

OPTIONAL_ARGS = ("guidance_scale", "negative_prompt")
"""Request fields passed on only to pipelines whose `__call__` takes them."""
FALLBACK_SIZE = 1024
"""Default image side for a pipeline that does not say its own (`default_sample_size`)."""


def default_size(pipe: Any) -> tuple[int, int]:
    """(height, width) the pipeline makes when given none: its latent sample size times the
    VAE's scale, as diffusers' text-to-image pipelines compute it."""
    sample, scale = getattr(pipe, "default_sample_size", None), getattr(pipe, "vae_scale_factor", 8)
    side = sample * scale if isinstance(sample, int) else FALLBACK_SIZE
    return side, side


def size_multiple(pipe: Any) -> int:
    """What height and width must divide by: the VAE's scale times the transformer's patch (or
    the image processor's own factor, which pipelines that pack latents set to that)."""
    scale = getattr(pipe, "vae_scale_factor", 8)
    transformer = getattr(pipe, "transformer", None)
    patch = getattr(getattr(transformer, "config", None), "patch_size", 1)
    processor = getattr(pipe, "image_processor", None)
    processor_scale = getattr(getattr(processor, "config", None), "vae_scale_factor", scale)
    return max(scale * (patch if isinstance(patch, int) else 1), processor_scale)


class WholePipelineExecutor:
    """`pipe`: an already built pipeline to run instead of loading `config.model`."""

    def __init__(self, config: DiTConfig, cache: DiTCacheManager, pipe: Any = None) -> None:
        self.cache = cache
        self.device = resolve_device(config.device)
        self.pipe = stage_pipeline(config, self.device, pipe)
        self.call_args = call_args(type(self.pipe))
        self._info = PipelineStageInfo(
            default_size(self.pipe),
            size_multiple(self.pipe),
            type(self.pipe).__name__,
            self.call_args,
            refuses=frozenset(OPTIONAL_ARGS) - self.call_args,
            # One: an editing pipeline given a list of images may take it as a batch of edits.
            max_input_images=1 if IMAGE_ARG in self.call_args else 0,
        )

    @property
    def info(self) -> PipelineStageInfo:
        return self._info

    def check_request(self, request: DiTRequest) -> None:
        if not isinstance(request.inputs.get("prompt"), str):
            raise FieldError("prompt", f"{self._info.pipeline_class} takes a text prompt")

    def estimate_bytes(self, request: DiTRequest) -> int:
        return 3 * request.params.height * request.params.width  # the image it returns

    def stats(self) -> dict[str, int]:
        return {}

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        out = DiTRunnerOutput()
        for request_id in scheduled.new_request_ids:  # held while the call runs, for accounting
            self.cache.allocate(request_id, {})
        for group in scheduled.groups:
            batch = [requests[rid] for rid in group]
            edits = any(IMAGE_ARG in r.inputs for r in batch)
            calls = [[r] for r in batch] if edits else [batch]
            for call in calls:
                start = time.perf_counter()
                out.finished.update(self._call(call))
                out.step_seconds.append(time.perf_counter() - start)
        return out

    @torch.inference_mode()
    def _call(self, batch: list[DiTRequest]) -> dict[str, np.ndarray]:
        """One pipeline call for requests sharing size, steps and guidance."""
        p = batch[0].params
        kwargs: dict[str, Any] = {
            "prompt": [r.inputs["prompt"] for r in batch],
            "height": p.height,
            "width": p.width,
            "num_inference_steps": p.num_inference_steps,
            "generator": [torch.Generator("cpu").manual_seed(r.params.seed) for r in batch],
        }
        if p.negative_prompt is not None:
            kwargs["negative_prompt"] = [r.params.negative_prompt for r in batch]
        if p.guidance_scale is not None:
            kwargs["guidance_scale"] = p.guidance_scale
        if p.do_cfg and "true_cfg_scale" in self.call_args:
            kwargs["true_cfg_scale"] = p.true_cfg_scale
        if IMAGE_ARG in batch[0].inputs:  # one request (see execute_model)
            given = [Image.fromarray(a).convert("RGB") for a in batch[0].inputs[IMAGE_ARG]]
            kwargs[IMAGE_ARG] = given[0] if len(given) == 1 else given
        made = self.pipe(**kwargs)[0]
        return {r.request_id: np.asarray(image) for r, image in zip(batch, made)}
