# SPDX-License-Identifier: Apache-2.0
"""The Wan VAE with its RMS norms as sums of squares decodes what diffusers' norms decode."""

from __future__ import annotations

import copy

import pytest
import torch

from vllm_omni.models.wan.vae_norm import use_fast_norms


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_norms_decode_the_same(tiny_models, dtype) -> None:
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(tiny_models["wan2.1-t2v"], subfolder="vae").to(dtype)
    fast = copy.deepcopy(vae)
    assert use_fast_norms(fast) > 0
    z = torch.randn(2, 16, 3, 4, 4, generator=torch.Generator().manual_seed(0)).to(dtype)
    with torch.inference_mode():
        expected = vae.decode(z).sample.float()
        got = fast.decode(z).sample.float()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert (got - expected).abs().max().item() <= tolerance
