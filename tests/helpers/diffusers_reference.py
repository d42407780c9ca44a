# SPDX-License-Identifier: Apache-2.0
"""The reference for omni correctness: diffusers' own pipeline, same weights and seed."""

from __future__ import annotations

import inspect

import numpy as np
import torch

from vllm_omni.diffusion.params import DiffusionSamplingParams


def load_pipeline(folder):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_image(pipe, prompt: str, p: DiffusionSamplingParams) -> np.ndarray:
    return pipeline_image(pipe, prompt, p)


def pipeline_image(pipe, prompt: str, p: DiffusionSamplingParams, **extra) -> np.ndarray:
    """Any pipeline's own call for one prompt and seed, with the optional fields `p` sets that
    the pipeline takes (`extra`: e.g. an edit's input image)."""
    kwargs = dict(extra)
    if p.negative_prompt is not None:
        kwargs["negative_prompt"] = p.negative_prompt
        if "true_cfg_scale" in inspect.signature(pipe.__call__).parameters:
            kwargs["true_cfg_scale"] = p.true_cfg_scale
    if p.guidance_scale is not None:
        kwargs["guidance_scale"] = p.guidance_scale
    with torch.inference_mode():
        image = pipe(
            prompt=prompt,
            height=p.height,
            width=p.width,
            num_inference_steps=p.num_inference_steps,
            generator=torch.Generator().manual_seed(p.seed),
            **kwargs,
        ).images[0]
    return np.asarray(image)


def pipeline_video(folder, prompt: str, p, **extra) -> np.ndarray:
    """A video pipeline's own call (loaded from `folder`) for one prompt and seed, with the
    optional fields `p` (VideoSamplingParams) sets, as uint8 frames (`extra`: e.g. the first
    frame of an image-to-video pipeline)."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if p.negative_prompt is not None:
        extra["negative_prompt"] = p.negative_prompt
    if p.guidance_scale_2 is not None:
        extra["guidance_scale_2"] = p.guidance_scale_2
    with torch.inference_mode():
        frames = pipe(
            prompt=prompt,
            height=p.height,
            width=p.width,
            num_frames=p.num_frames,
            num_inference_steps=p.num_inference_steps,
            guidance_scale=p.guidance_scale,
            generator=torch.Generator().manual_seed(p.seed),
            output_type="np",
            **extra,
        ).frames[0]
    return (frames * 255).round().astype(np.uint8)


def max_pixel_diff(a, b) -> int:
    return int(np.abs(np.asarray(a).astype(int) - np.asarray(b).astype(int)).max())
