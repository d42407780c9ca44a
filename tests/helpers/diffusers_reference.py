# SPDX-License-Identifier: Apache-2.0
"""The reference for omni correctness: diffusers' own pipeline, same weights and seed."""

from __future__ import annotations

import numpy as np
import torch

from vllm_omni.diffusion.params import DiffusionSamplingParams


def load_pipeline(folder):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_image(pipe, prompt: str, p: DiffusionSamplingParams) -> np.ndarray:
    image = pipe(
        prompt,
        negative_prompt=p.negative_prompt,
        true_cfg_scale=p.true_cfg_scale,
        height=p.height,
        width=p.width,
        num_inference_steps=p.num_inference_steps,
        generator=torch.Generator().manual_seed(p.seed),
    ).images[0]
    return np.asarray(image)


def max_pixel_diff(a, b) -> int:
    return int(np.abs(np.asarray(a).astype(int) - np.asarray(b).astype(int)).max())
