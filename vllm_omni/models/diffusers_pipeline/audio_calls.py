# SPDX-License-Identifier: Apache-2.0
"""A diffusers text-to-audio pipeline no family claims (sound, music), step-batched by the
framework's call loop (vllm_omni.diffusion.call_loop) as the image pipelines are: each request
runs the pipeline's own `__call__` with its own scheduler and seeded generator, and the requests
at a step share the denoiser's forward."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from vllm_omni.diffusion.executor_kind import AudioStageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.calls import OwnCallPipeline
from vllm_omni.models.diffusers_pipeline.signature import DURATION_ARGS

FALLBACK_MAX_SECONDS = 30.0
"""The longest clip of a pipeline whose denoiser and VAE do not say theirs."""


def duration_arg(call_args: frozenset[str]) -> str:
    """The `__call__` argument that sets the clip's length in seconds."""
    return next(name for name in DURATION_ARGS if name in call_args)


def sample_rate(pipe: Any) -> int:
    """The rate of the pipeline's waveforms: its VAE's (Stable Audio's Oobleck) or its
    vocoder's (AudioLDM's HiFi-GAN)."""
    for component in ("vae", "vocoder"):
        rate = getattr(getattr(getattr(pipe, component, None), "config", None), "sampling_rate", 0)
        if isinstance(rate, int) and rate > 0:
            return rate
    raise ValueError(f"{type(pipe).__name__}: neither its vae nor its vocoder has a sampling_rate")


def max_seconds(pipe: Any, denoiser: str) -> float:
    """The longest clip: the denoiser's latent frames times the VAE's samples per frame (Stable
    Audio's `sample_size` x `hop_length`), where both are known."""
    frames = getattr(getattr(getattr(pipe, denoiser), "config", None), "sample_size", None)
    hop = getattr(getattr(pipe, "vae", None), "hop_length", None)
    if isinstance(frames, int) and isinstance(hop, int):
        return frames * hop / sample_rate(pipe)
    return FALLBACK_MAX_SECONDS


class AudioPipelineCalls(OwnCallPipeline):
    """The call loop's `PipelineCalls` for a text-to-audio pipeline."""

    def __init__(self, pipe: Any) -> None:
        super().__init__(pipe)
        self.duration = duration_arg(self.call_args)
        longest = max_seconds(pipe, self.denoiser)
        default = inspect.signature(type(pipe).__call__).parameters[self.duration].default
        vae_config = getattr(getattr(pipe, "vae", None), "config", None)
        self._info = AudioStageInfo(
            sample_rate(pipe),
            getattr(vae_config, "audio_channels", 1),
            default if isinstance(default, (int, float)) and 0 < default <= longest else longest,
            longest,
            type(pipe).__name__,
        )

    @property
    def info(self) -> AudioStageInfo:
        return self._info

    def check_request(self, request: DiTRequest) -> None:
        self.check_prompt(request)
        for name in ("negative_prompt", "guidance_scale"):
            if getattr(request.params, name) is not None and name not in self.call_args:
                raise FieldError(name, f"{self._info.pipeline_class} takes no {name}")

    def estimate_bytes(self, request: DiTRequest) -> int:
        samples = request.params.seconds * self._info.sample_rate
        return int(4 * self._info.channels * samples)  # the float32 waveform it returns

    def call_kwargs(self, request: DiTRequest) -> dict[str, Any]:
        p = request.params
        kwargs: dict[str, Any] = {
            "prompt": request.inputs["prompt"],
            self.duration: p.seconds,
            "num_inference_steps": p.num_inference_steps,
            "generator": torch.Generator("cpu").manual_seed(p.seed),
        }
        if "output_type" in self.call_args:
            kwargs["output_type"] = "np"
        if p.negative_prompt is not None:
            kwargs["negative_prompt"] = p.negative_prompt
        if p.guidance_scale is not None:
            kwargs["guidance_scale"] = p.guidance_scale
        return kwargs

    def result(self, request: DiTRequest, output: Any) -> np.ndarray:
        """The clip as float32 `(samples,)`, or `(channels, samples)` for stereo."""
        audio = np.asarray(output[0][0], dtype=np.float32)
        return audio[0] if audio.ndim == 2 and audio.shape[0] == 1 else audio
