# SPDX-License-Identifier: Apache-2.0
"""A live `vllm serve` / `vllm-omni serve` process on loopback, for end-to-end tests."""

from __future__ import annotations

from benchmarks.common.server import BIN, ServerProcess, free_port

__all__ = ["BIN", "ServerProcess", "free_port", "greedy_token_ids"]


def greedy_token_ids(client, model: str, prompt, num_tokens: int) -> list[int]:
    """Exactly `num_tokens` greedy tokens for `prompt` (text or token ids) from an OpenAI
    completions endpoint (vLLM's `min_tokens` and `return_token_ids` extensions)."""
    completion = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=num_tokens,
        temperature=0.0,
        extra_body={"min_tokens": num_tokens, "return_token_ids": True},
    )
    return list(completion.choices[0].token_ids)
