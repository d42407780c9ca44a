# SPDX-License-Identifier: Apache-2.0
"""A diffusers text-to-video pipeline no family claims, step-batched by the framework's call loop
(vllm_omni.diffusion.call_loop) as the image pipelines are: each request runs the pipeline's own
`__call__` with its own scheduler and seeded generator, and the requests at a step share the
denoiser's forward."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from vllm_omni.diffusion.executor_kind import VideoStageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.calls import OwnCallPipeline

DEFAULT_FPS = 16.0
"""The playback rate written into a video whose request gives none (a pipeline does not say
its own; `fps` in the request sets it)."""
FALLBACK_SHAPE = (49, 480, 720)
"""(frames, height, width) of a pipeline whose call and transformer say no default."""
LATENT_FRAMES_ODD = frozenset({"AutoencoderKLCogVideoX"})
"""VAEs that make `temporal` x k + 1 frames only from an odd number of latent frames: their
causal decoder keeps the first frame of an odd count and doubles every frame of an even one
(CogVideoX's, decoding latent frames two at a time), so frame counts step by twice the VAE's
temporal factor."""


def _scale(pipe: Any, attribute: str, fallback: int) -> int:
    value = getattr(pipe, attribute, None)
    return value if isinstance(value, int) and value > 0 else fallback


def frame_step(pipe: Any) -> int:
    """What `num_frames - 1` must divide by: the VAE's temporal compression (doubled for a VAE
    that needs an odd number of latent frames)."""
    temporal = _scale(pipe, "vae_scale_factor_temporal", 4)
    return 2 * temporal if type(pipe.vae).__name__ in LATENT_FRAMES_ODD else temporal


def default_shape(pipe: Any) -> tuple[int, int, int]:
    """(frames, height, width) the pipeline makes when given none: its call's defaults where
    they are numbers, else its transformer's sample shape, as diffusers' video pipelines compute
    it (latent sample size times the VAE's scale)."""
    defaults = inspect.signature(type(pipe).__call__).parameters
    config = getattr(getattr(pipe, "transformer", None), "config", None)
    spatial = _scale(pipe, "vae_scale_factor_spatial", 8)
    sample = {
        "num_frames": getattr(config, "sample_frames", None),
        "height": getattr(config, "sample_height", None),
        "width": getattr(config, "sample_width", None),
    }
    shape = []
    for name, fallback in zip(("num_frames", "height", "width"), FALLBACK_SHAPE):
        default = defaults[name].default if name in defaults else None
        if isinstance(default, int):
            shape.append(default)
        elif isinstance(sample[name], int):
            shape.append(sample[name] * (1 if name == "num_frames" else spatial))
        else:
            shape.append(fallback)
    return shape[0], shape[1], shape[2]


def size_multiple(pipe: Any) -> int:
    """What height and width must divide by: the VAE's spatial scale times the transformer's
    spatial patch."""
    config = getattr(getattr(pipe, "transformer", None), "config", None)
    patch = getattr(config, "patch_size", 1)
    patch = patch if isinstance(patch, int) else (patch[-1] if patch else 1)
    return _scale(pipe, "vae_scale_factor_spatial", 8) * patch


class VideoPipelineCalls(OwnCallPipeline):
    """The call loop's `PipelineCalls` for a text-to-video pipeline."""

    def __init__(self, pipe: Any) -> None:
        super().__init__(pipe)
        self._info = VideoStageInfo(
            default_shape(pipe),
            size_multiple(pipe),
            frame_step(pipe),
            DEFAULT_FPS,
            image_to_video=False,
            pipeline_class=type(pipe).__name__,
        )

    @property
    def info(self) -> VideoStageInfo:
        return self._info

    def check_request(self, request: DiTRequest) -> None:
        self.check_prompt(request)
        negative = request.params.negative_prompt
        if negative is not None and "negative_prompt" not in self.call_args:
            raise FieldError("negative_prompt", f"{self._info.pipeline_class} takes none")

    def estimate_bytes(self, request: DiTRequest) -> int:
        p = request.params
        return 4 * 3 * p.num_frames * p.height * p.width  # its frames, as float32 arrays

    def call_kwargs(self, request: DiTRequest) -> dict[str, Any]:
        p = request.params
        kwargs: dict[str, Any] = {
            "prompt": request.inputs["prompt"],
            "height": p.height,
            "width": p.width,
            "num_frames": p.num_frames,
            "num_inference_steps": p.num_inference_steps,
            "generator": torch.Generator("cpu").manual_seed(p.seed),
            "output_type": "np",
        }
        if p.negative_prompt is not None:
            kwargs["negative_prompt"] = p.negative_prompt
        if "guidance_scale" in self.call_args:
            kwargs["guidance_scale"] = p.guidance_scale
        return kwargs

    def result(self, request: DiTRequest, output: Any) -> dict[str, Any]:
        """`{"video": uint8 frames (F, H, W, 3), "fps"}`, rounded as diffusers rounds to PIL."""
        frames = np.asarray(output[0][0])
        return {"video": (frames * 255).round().astype(np.uint8), "fps": request.params.fps}
