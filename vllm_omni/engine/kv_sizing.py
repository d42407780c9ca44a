# SPDX-License-Identifier: Apache-2.0
"""KV cache sizing for stages that keep nothing between requests (pooling encoders).

vLLM sizes a KV cache for generation: a share of the device's memory (on CPU, the plugin's
default of up to 4 GiB per worker), so that many long sequences can stay resident while they
decode. A pooling encoder runs each prompt in one forward pass and frees its blocks at once, so
it never holds more than one scheduler step's tokens: the cache it needs is the step's token
budget plus each sequence's last partly filled block - a few MiB for the tiny models, hundreds of
MiB for a 7B encoder, against the generation default of GiBs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def kv_bytes_per_token(vllm_config: VllmConfig) -> int:
    """Key and value bytes one token takes in every attention layer of this worker."""
    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    cache_dtype = vllm_config.cache_config.cache_dtype
    itemsize = model.dtype.itemsize if cache_dtype == "auto" else 1  # fp8 caches
    per_layer = 2 * model.get_num_kv_heads(parallel) * model.get_head_size() * itemsize
    return per_layer * model.get_num_layers(parallel)


def one_step_kv_cache_bytes(vllm_config: VllmConfig) -> int:
    """Bytes for the largest batch one step can hold: `max_num_batched_tokens` tokens, a part-
    filled block per sequence, and never less than one `max_model_len` prompt (vLLM refuses to
    start a cache that cannot hold one)."""
    scheduler = vllm_config.scheduler_config
    block = vllm_config.cache_config.block_size
    blocks = -(-scheduler.max_num_batched_tokens // block) + scheduler.max_num_seqs
    blocks = max(blocks, -(-vllm_config.model_config.max_model_len // block) + 1)
    return blocks * block * kv_bytes_per_token(vllm_config)
