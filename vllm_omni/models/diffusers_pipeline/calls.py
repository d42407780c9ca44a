# SPDX-License-Identifier: Apache-2.0
"""A diffusers pipeline no family claims, step-batched by the framework's call loop
(vllm_omni.diffusion.call_loop): each request runs the pipeline's own `__call__` with its own
scheduler and seeded generator, so every image is the one the pipeline makes for that prompt
and seed alone, and the requests at a step share the denoiser's forward."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.info import PipelineStageInfo
from vllm_omni.models.diffusers_pipeline.signature import IMAGE_ARG, call_args

OPTIONAL_ARGS = ("guidance_scale", "negative_prompt")
"""Request fields passed on only to pipelines whose `__call__` takes them."""
FALLBACK_SIZE = 1024
"""Default image side for a pipeline that does not say its own (`default_sample_size`)."""
DENOISERS = ("transformer", "unet")
"""The pipeline components that denoise, in the order they are looked for."""
EDITS = "Edit"
"""In the class name of a pipeline that needs an input image (`QwenImageEditPipeline`): the
others that take `image` make an image from the prompt alone too (FLUX.2's, Kontext's reference
images). The signature cannot tell them apart: both default `image` to None."""


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


def denoiser_of(pipe: Any) -> str:
    for name in DENOISERS:
        if isinstance(getattr(pipe, name, None), torch.nn.Module):
            return name
    raise ValueError(f"{type(pipe).__name__} has none of the denoisers {list(DENOISERS)}")


class OwnCallPipeline:
    """What the call loop's `PipelineCalls` of every kind of pipeline share: the pipeline, its
    denoiser, what its `__call__` takes, and a request's text prompt checked."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.denoiser = denoiser_of(pipe)
        self.call_args = call_args(type(pipe))
        self.counts_steps = "callback_on_step_end" in self.call_args

    def check_prompt(self, request: DiTRequest) -> None:
        if not isinstance(request.inputs.get("prompt"), str):
            raise FieldError("prompt", f"{type(self.pipe).__name__} takes a text prompt")


class ImagePipelineCalls(OwnCallPipeline):
    """The call loop's `PipelineCalls` for a text-to-image or image-editing pipeline."""

    def __init__(self, pipe: Any) -> None:
        super().__init__(pipe)
        self._info = PipelineStageInfo(
            default_size(pipe),
            size_multiple(pipe),
            type(pipe).__name__,
            self.call_args,
            refuses=frozenset(OPTIONAL_ARGS) - self.call_args,
            # One: an editing pipeline given a list of images may take it as a batch of edits.
            max_input_images=1 if IMAGE_ARG in self.call_args else 0,
            needs_image=IMAGE_ARG in self.call_args and EDITS in type(pipe).__name__,
        )

    @property
    def info(self) -> PipelineStageInfo:
        return self._info

    def check_request(self, request: DiTRequest) -> None:
        self.check_prompt(request)

    def estimate_bytes(self, request: DiTRequest) -> int:
        return 3 * request.params.height * request.params.width  # the image it returns

    def call_kwargs(self, request: DiTRequest) -> dict[str, Any]:
        p = request.params
        kwargs: dict[str, Any] = {
            "prompt": request.inputs["prompt"],
            "height": p.height,
            "width": p.width,
            "num_inference_steps": p.num_inference_steps,
            "generator": torch.Generator("cpu").manual_seed(p.seed),
        }
        if p.negative_prompt is not None:
            kwargs["negative_prompt"] = p.negative_prompt
        if p.guidance_scale is not None:
            kwargs["guidance_scale"] = p.guidance_scale
        if p.do_cfg and "true_cfg_scale" in self.call_args:
            kwargs["true_cfg_scale"] = p.true_cfg_scale
        if IMAGE_ARG in request.inputs:
            given = [Image.fromarray(a).convert("RGB") for a in request.inputs[IMAGE_ARG]]
            kwargs[IMAGE_ARG] = given[0] if len(given) == 1 else given
        return kwargs

    def result(self, request: DiTRequest, output: Any) -> np.ndarray:
        return np.asarray(output[0][0])
