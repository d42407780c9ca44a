# SPDX-License-Identifier: Apache-2.0
"""Wan's VAE with its RMS norms computed as a sum of squares.

`WanRMS_norm` divides by `F.normalize`'s vector norm over the channel dimension. On the CPU
torch's `linalg_vector_norm` over that strided dimension is about 20x slower than squaring,
summing and taking the root (torch 2.13: 10.6 ms against 0.5 ms on a 4x16x3x64x64 tensor), and
it took 60% of the tiny Wan VAE's decode. `ChannelRMSNorm` computes the same function (the same
parameters, F.normalize's epsilon, float32 for 16-bit inputs) and `use_fast_norms(vae)` puts
one in place of each norm of a loaded VAE. The outputs agree to float rounding (tests/models/
wan/test_vae_norm.py); `pinned()` fails tests/test_patches.py when diffusers changes the norm.
"""

from __future__ import annotations

import torch
from torch import nn

EPS = 1e-12  # F.normalize's default


class ChannelRMSNorm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.dim = 1 if norm.channel_first else -1
        self.scale = norm.scale
        self.gamma = norm.gamma
        self.bias = norm.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float() if x.dtype.itemsize < 4 else x
        normalized = (y / y.square().sum(self.dim, keepdim=True).sqrt().clamp_min(EPS)).to(x.dtype)
        return normalized * self.scale * self.gamma + self.bias


def use_fast_norms(vae: nn.Module) -> int:
    """Replace every WanRMS_norm of `vae` by a ChannelRMSNorm sharing its parameters; how many."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    found = [(name, m) for name, m in vae.named_modules() if isinstance(m, WanRMS_norm)]
    for name, norm in found:
        parent_name, _, child = name.rpartition(".")
        setattr(vae.get_submodule(parent_name), child, ChannelRMSNorm(norm))
    return len(found)


def pinned() -> list:
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    from vllm_omni._patches import Pinned

    return [
        Pinned(
            WanRMS_norm,
            "forward",
            "fc44101b6513",
            "vae_norm.ChannelRMSNorm computes it (F.normalize over channels in float32 for "
            "16-bit inputs, times sqrt(dim), gamma, plus bias) with a faster norm.",
        )
    ]
