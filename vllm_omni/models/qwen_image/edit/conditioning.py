# SPDX-License-Identifier: Apache-2.0
"""An edit's input images as the DiT's conditioning latents.

The editing pipelines encode each input image with the VAE at about `vae_area` pixels (its
aspect kept) and append its packed latents to the noisy latents' sequence; the transformer sees
one grid per image after the output's (`img_shapes`) and the prediction for the output's rows is
kept. Drawn by the pipeline's own `prepare_latents`, so the noise for a seed is diffusers'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

VAE_AREA = 1024 * 1024
"""About how many pixels the editing pipelines encode each input image at (and make an edit
of, when it gives no size)."""


def area_size(area: int, image_size: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of about `area` pixels in the aspect of an image of `image_size`
    (width, height), rounded as the editing pipelines round it."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions

    width, height = calculate_dimensions(area, image_size[0] / image_size[1])
    return height, width


@dataclass(frozen=True)
class EditConditioning:
    """`takes_list`: the pipeline's `prepare_latents` takes a list of images (Edit-Plus) rather
    than one image tensor (Edit); `max_images` per request."""

    takes_list: bool
    max_images: int
    vae_area: int = VAE_AREA

    def vae_size(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """(height, width) the pipeline encodes an image of `image_size` (width, height) at."""
        return area_size(self.vae_area, image_size)

    def latent_tokens(self, images: Sequence[Any]) -> int:
        """Packed latent rows the images add to each transformer row (2x2 patches of 8x)."""
        sizes = [self.vae_size(as_pil(image).size) for image in images]
        return sum((h // 16) * (w // 16) for h, w in sizes)

    @torch.inference_mode()
    def prepare(
        self, pipe, images: Sequence[Any], height: int, width: int, dtype, device, generator
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
        """(noise latents, image latents, the images' latent grids) for one request."""
        tensors, grids = [], []
        for image in images:
            pil = as_pil(image)
            vae_height, vae_width = self.vae_size(pil.size)
            tensor = pipe.image_processor.preprocess(pil, vae_height, vae_width).unsqueeze(2)
            tensors.append(tensor)
            grids.append((1, vae_height // 16, vae_width // 16))
        image_arg = tensors if self.takes_list else tensors[0]
        channels = pipe.transformer.config.in_channels // 4
        latents, image_latents = pipe.prepare_latents(
            image_arg, 1, channels, height, width, dtype, device, generator
        )
        return latents, image_latents, grids


def as_pil(image: Any) -> Image.Image:
    """An input image as sent to the stage process (an array) or given in-process (PIL)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    return image.convert("RGB")
