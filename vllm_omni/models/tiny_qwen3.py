# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Qwen3 text encoder, shared by the tiny builders of the pipelines that
encode their prompts with Qwen3 (Z-Image's, FLUX.2 klein's): Qwen3's code is the same in both,
only the sizes differ."""

from __future__ import annotations

from typing import Any

from vllm_omni.testing import tiny_tokenizer as tt
from vllm_omni.testing.tiny_common import randomize_


def qwen3_text_encoder(
    *,
    width: int,
    mlp_width: int,
    layers: int,
    heads: int,
    head_dim: int,
    max_positions: int,
    seed: int,
    flavor: tt.Flavor = tt.PLAIN,
) -> Any:
    """Qwen3 as the releases that encode text with it have it (one key/value head shared by the
    query heads, q/k norms, SwiGLU MLP, rotary positions, tied embedding) over the tiny
    tokenizer of `flavor`, its tied output projection the (std 1) embedding."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=tt.VOCAB_SIZE,
        hidden_size=width,
        intermediate_size=mlp_width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        max_window_layers=layers,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        bos_token_id=tt.token_id(tt.ENDOFTEXT, flavor),
        eos_token_id=tt.token_id(tt.IM_END, flavor),
        pad_token_id=tt.token_id(tt.ENDOFTEXT, flavor),
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    randomize_(model, seed)
    return model
