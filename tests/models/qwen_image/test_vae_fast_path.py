# SPDX-License-Identifier: Apache-2.0
"""The single-frame VAE path gives diffusers' decode (up to float rounding), takes no 3-D
convolution for an image, and leaves videos and other VAEs to diffusers' own code."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile

from vllm_omni.models.qwen_image.vae_fast_path import accelerate_vae
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir


@pytest.fixture(scope="module")
def vaes():
    from diffusers import AutoencoderKLQwenImage

    folder = build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"] / "vae"
    stock = AutoencoderKLQwenImage.from_pretrained(folder)
    fast = AutoencoderKLQwenImage.from_pretrained(folder)
    return stock, fast, accelerate_vae(fast)


def _decode(vae, z):
    with torch.inference_mode():
        return vae.decode(z, return_dict=False)[0]


@pytest.mark.parametrize("shape", [(2, 8, 8), (1, 24, 24), (1, 12, 20)])
def test_image_decode_matches_diffusers_without_conv3d(vaes, shape) -> None:
    stock, fast, count = vaes
    assert count > 0
    batch, h, w = shape
    z = torch.randn(batch, 16, 1, h, w, generator=torch.Generator().manual_seed(h * w))
    with profile() as prof:
        ours = _decode(fast, z)
    ops = {event.key for event in prof.key_averages()}
    assert not any("conv3d" in op for op in ops), sorted(op for op in ops if "conv" in op)
    torch.testing.assert_close(ours, _decode(stock, z), rtol=0, atol=1e-5)


def test_video_frames_take_diffusers_path(vaes) -> None:
    stock, fast, _ = vaes
    z = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(1))
    with profile() as prof:
        ours = _decode(fast, z)
    # Frames after the first carry the causal cache: diffusers' own convolutions run them.
    assert any("conv3d" in event.key for event in prof.key_averages())
    torch.testing.assert_close(ours, _decode(stock, z), rtol=0, atol=1e-5)


def test_accelerate_is_idempotent_and_skips_other_modules(vaes) -> None:
    _, fast, count = vaes
    assert accelerate_vae(fast) == count
    assert accelerate_vae(torch.nn.Sequential(torch.nn.Conv3d(2, 2, 3))) == 0
