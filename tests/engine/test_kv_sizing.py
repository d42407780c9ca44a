# SPDX-License-Identifier: Apache-2.0
"""One step's KV cache for a pooling encoder, from the numbers vLLM's config holds."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vllm_omni.engine.kv_sizing import kv_bytes_per_token, one_step_kv_cache_bytes


def _config(
    *, layers=28, kv_heads=4, head=128, dtype=torch.bfloat16, cache_dtype="auto",
    batched=8192, seqs=256, block=16, max_len=1024,
):  # fmt: skip
    model = SimpleNamespace(
        dtype=dtype,
        max_model_len=max_len,
        get_num_kv_heads=lambda parallel: kv_heads,
        get_head_size=lambda: head,
        get_num_layers=lambda parallel: layers,
    )
    return SimpleNamespace(
        model_config=model,
        parallel_config=None,
        cache_config=SimpleNamespace(cache_dtype=cache_dtype, block_size=block),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=batched, max_num_seqs=seqs),
    )


def test_bytes_per_token_counts_keys_and_values_in_every_layer() -> None:
    # Qwen2.5-VL-7B's language model: 28 layers, 4 KV heads of 128, bf16.
    assert kv_bytes_per_token(_config()) == 2 * 28 * 4 * 128 * 2
    assert kv_bytes_per_token(_config(dtype=torch.float32)) == 2 * 28 * 4 * 128 * 4
    assert kv_bytes_per_token(_config(cache_dtype="fp8")) == 2 * 28 * 4 * 128


def test_one_step_holds_the_token_budget_and_a_block_per_sequence() -> None:
    per_token = 2 * 28 * 4 * 128 * 2
    blocks = 8192 // 16 + 256
    assert one_step_kv_cache_bytes(_config()) == blocks * 16 * per_token
    # 672 MiB for a 7B encoder at an 8K-token step, against the generation default of GiBs.
    assert one_step_kv_cache_bytes(_config()) == 672 << 20


def test_one_step_never_holds_less_than_one_longest_prompt() -> None:
    config = _config(batched=256, seqs=1, max_len=4000)
    assert one_step_kv_cache_bytes(config) >= 4000 * kv_bytes_per_token(config)
    # Partial blocks round up.
    config = _config(batched=100, seqs=1, max_len=10, block=16)
    assert one_step_kv_cache_bytes(config) == (7 + 1) * 16 * kv_bytes_per_token(config)
