# SPDX-License-Identifier: Apache-2.0
"""LatentDecoder: packed DiT latents -> images, with the pipeline's own VAE and post-processing.

Shared by the DiT stage (when it decodes itself) and the VAE decoder stage (when decoding
runs in its own process, overlapping the next requests' denoising).
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_omni.models.qwen_image.vae_fast_path import accelerate_vae


class LatentDecoder:
    def __init__(self, pipe) -> None:
        self.pipe = pipe
        self.vae = pipe.vae
        accelerate_vae(self.vae)  # an image's decode as 2-D work on CPU (5-8x faster there)
        self.vae_scale_factor = pipe.vae_scale_factor

    @property
    def size_multiple(self) -> int:
        return self.vae_scale_factor * 2  # VAE compression x 2x2 latent packing

    @property
    def default_size(self) -> tuple[int, int]:
        side = self.pipe.default_sample_size * self.vae_scale_factor
        return side, side

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> list[np.ndarray]:
        """[batch, patches, channels] packed latents of one size -> uint8 HWC images, exactly
        as the pipeline's epilogue makes them (same scaling, VAE call, rounding)."""
        vae = self.vae
        lat = self.pipe._unpack_latents(latents, height, width, self.vae_scale_factor)
        lat = lat.to(vae.device, vae.dtype)
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(lat.device, lat.dtype)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(lat.device, lat.dtype)
        image = vae.decode(lat * std + mean, return_dict=False)[0][:, :, 0]
        return [np.asarray(im) for im in self.pipe.image_processor.postprocess(image, "pil")]
