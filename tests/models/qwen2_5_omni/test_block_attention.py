# SPDX-License-Identifier: Apache-2.0
"""Block-band attention for the token2wav DiT: what transformers' dense block mask lets through,
computed per block; the DiT's output unchanged up to float rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_omni.models.qwen2_5_omni.block_attention import (
    BLOCK_BAND,
    block_band_attention,
    use_block_band_attention,
)

BLOCK = 24


def _dense(query, key, value, back: int, ahead: int) -> torch.Tensor:
    """transformers' path: the block difference, the layer's mask, dense SDPA."""
    blocks = torch.arange(query.shape[2]) // BLOCK
    difference = blocks[None, :] - blocks[:, None]
    mask = (difference >= -back) & (difference <= ahead)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)


@pytest.mark.parametrize("frames", [1, 23, 24, 25, 48, 70, 200, 1024])
@pytest.mark.parametrize("back,ahead", [(0, 0), (1, 0), (0, 1), (1, 1), (2, 1)])
def test_equals_the_dense_block_mask(frames: int, back: int, ahead: int) -> None:
    generator = torch.Generator().manual_seed(frames * 10 + back)
    query, key, value = (torch.randn(2, 3, frames, 16, generator=generator) for _ in range(3))
    module = torch.nn.Module()
    module.block_band = (BLOCK, back, ahead)
    ours, weights = block_band_attention(module, query, key, value, attention_mask=None)
    assert weights is None and ours.shape == (2, frames, 3, 16)
    torch.testing.assert_close(ours, _dense(query, key, value, back, ahead), rtol=0, atol=1e-6)


def test_the_dit_gives_the_same_output_without_dense_masks() -> None:
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniToken2WavDiTModel,
    )

    from vllm_omni.models.qwen2_5_omni import tiny as tiny_omni

    config = tiny_omni.qwen25_omni_config().token2wav_config.dit_config
    torch.manual_seed(0)
    dit = Qwen2_5OmniToken2WavDiTModel(config).eval()
    codes = 64  # 128 frames: five blocks and a partial one
    frames = codes * config.repeats
    inputs = {
        "hidden_states": torch.randn(2, frames, config.mel_dim),
        "speaker_embedding": torch.randn(2, frames, config.enc_emb_dim),
        "condition_vector": torch.randn(2, 30, config.mel_dim),
        "quantized_code": torch.randint(0, config.num_embeds, (2, codes)),
        "time_step": torch.tensor(0.3),
    }
    with torch.no_grad():
        dense = dit(**inputs)
        use_block_band_attention(dit)
        banded = dit(**inputs)
    assert dit.config._attn_implementation == BLOCK_BAND
    assert dit._create_block_diff(inputs["hidden_states"]).numel() == 1  # no [b, h, n, n] mask
    torch.testing.assert_close(banded, dense, rtol=0, atol=1e-5)


def test_a_changed_dit_is_refused() -> None:
    with pytest.raises(RuntimeError, match="token2wav DiT changed"):
        use_block_band_attention(torch.nn.Linear(2, 2))
