# SPDX-License-Identifier: Apache-2.0
"""Sizing prefill chunks to equal cost: the next chunk of a request, a whole plan, and how many
pipeline steps a prompt should take.

With p pipeline stages, a prompt whose prefill costs T per stage, split into m equal-cost chunks,
and a fixed cost c per step, the prefill takes about (m + p - 1) * (T / m + c): more chunks shrink
the pipeline's fill and drain, but pay the step cost more often. The minimum is at
m* = sqrt((p - 1) * T / c) (`optimal_num_steps`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from vllm_omni.cpp.cost_model import CostModel, _check_int, _check_real


def next_chunk_size(
    cost_model: CostModel,
    num_cached_tokens: int,
    num_remaining_tokens: int,
    step_budget: float,
    block_size: int = 16,
    min_chunk: int = 0,
) -> int:
    """Tokens of the next chunk of a prefill with `num_remaining_tokens` left after
    `num_cached_tokens`: the largest multiple of block_size whose chunk_cost fits `step_budget`,
    at least max(min_chunk, block_size) rounded up to a block multiple (taken even over budget, so
    prefill progresses), and the whole remainder when fewer than min_chunk tokens would be left.
    """
    if num_remaining_tokens <= 0:
        return 0
    floor = -(-max(min_chunk, block_size) // block_size) * block_size
    size = max(
        cost_model.max_chunk(num_cached_tokens, step_budget) // block_size * block_size, floor
    )
    if size >= num_remaining_tokens or num_remaining_tokens - size < min_chunk:
        return num_remaining_tokens
    return size


def plan_chunks(
    prompt_len: int,
    cost_model: CostModel,
    step_budget: float,
    block_size: int = 16,
    min_chunk: int = 0,
    start: int = 0,
) -> list[int]:
    """Sizes of successive prefill chunks covering tokens start..prompt_len.

    `step_budget` bounds chunk_cost (step_overhead excluded: every step pays it alike). Each
    chunk is the largest multiple of block_size within budget, but at least max(min_chunk,
    block_size) rounded up to a block multiple (taken even over budget, so planning progresses);
    the last chunk is the remainder. A chunk that would leave < min_chunk tokens absorbs them.
    """
    for name, value, low in (
        ("prompt_len", prompt_len, 0),
        ("block_size", block_size, 1),
        ("min_chunk", min_chunk, 0),
        ("start", start, 0),
    ):
        _check_int(name, value, low)
    if start > prompt_len:
        raise ValueError(f"start ({start}) exceeds prompt_len ({prompt_len})")
    _check_real("step_budget", step_budget, positive=True)
    chunks, pos = [], start
    while pos < prompt_len:
        size = next_chunk_size(
            cost_model, pos, prompt_len - pos, step_budget, block_size, min_chunk
        )
        chunks.append(size)
        pos += size
    return chunks


def budget_for_chunk(cost_model: CostModel, first_chunk: int) -> float:
    """The step_budget whose first chunk (from an empty cache) is exactly `first_chunk` tokens."""
    _check_int("first_chunk", first_chunk, 1)
    return cost_model.chunk_cost(first_chunk, 0)


def balance(chunks: Iterable[int], cost_model: CostModel, start: int = 0) -> float:
    """max / mean of the chunks' costs, each after the tokens before it (1.0 = perfectly even)."""
    costs, pos = [], start
    for size in chunks:
        costs.append(cost_model.chunk_cost(size, pos))
        pos += size
    if not costs or sum(costs) == 0:
        raise ValueError("chunks must contain at least one non-empty chunk")
    return max(costs) / (sum(costs) / len(costs))


def optimal_num_steps(
    prefill_cost: float, step_overhead: float, pp_size: int, max_steps: int
) -> int:
    """Number of equal-cost steps m in [1, max_steps] that minimises (m + p - 1) * (T / m + c)."""
    _check_int("pp_size", pp_size, 1)
    _check_int("max_steps", max_steps, 1)
    if pp_size == 1 or prefill_cost <= 0:
        return 1
    if step_overhead <= 0:
        return max_steps
    best = math.sqrt((pp_size - 1) * prefill_cost / step_overhead)
    candidates = {min(max(m, 1), max_steps) for m in (math.floor(best), math.ceil(best))}

    def makespan(m: int) -> float:
        return (m + pp_size - 1) * (prefill_cost / m + step_overhead)

    return min(candidates, key=makespan)


def budget_for_steps(
    cost_model: CostModel,
    num_tokens: int,
    num_steps: int,
    start: int = 0,
    block_size: int = 16,
    min_chunk: int = 0,
) -> float:
    """The smallest step budget whose plan prefills tokens start..num_tokens in at most num_steps
    chunks. total / num_steps alone leaves a short last chunk (every chunk is rounded down to a
    block), which drags the mean load down; the smallest fitting budget keeps the last one full.
    """
    _check_int("num_steps", num_steps, 1)
    total = cost_model.chunk_cost(num_tokens - start, start)
    if num_steps == 1 or total == 0:
        return total

    def fits(budget: float) -> bool:
        plan = plan_chunks(num_tokens, cost_model, budget, block_size, min_chunk, start)
        return len(plan) <= num_steps

    low, high = total / num_steps, total / (num_steps - 1)
    while not fits(high):
        low, high = high, high * 1.5
    if fits(low):
        return low
    for _ in range(24):  # bisection to ~1e-7 of the interval
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


def prefill_budget(
    cost_model: CostModel,
    num_tokens: int,
    pp_size: int,
    start: int = 0,
    block_size: int = 16,
    min_chunk: int = 0,
    num_steps: int | None = None,
    micro_chunks: int = 1,
) -> float:
    """CPP's step budget for prefilling tokens start..num_tokens: `num_steps` equal-cost steps,
    by default the number that minimises the predicted time (`optimal_num_steps`), divided by
    `micro_chunks` when the worker splits every step further (RFC phase 2)."""
    remaining = num_tokens - start
    if num_steps is None:
        # Each extra step pays the fixed step cost and one more pass over the context (on
        # average about half way through this prefill).
        per_step = cost_model.step_overhead + cost_model.context * (start + remaining / 2)
        num_steps = optimal_num_steps(
            cost_model.chunk_cost(remaining, start),
            per_step,
            pp_size,
            max_steps=max(1, math.ceil(remaining / block_size)),
        )
    num_steps = max(1, math.ceil(num_steps / micro_chunks))
    return budget_for_steps(cost_model, num_tokens, num_steps, start, block_size, min_chunk)


def cpp_plan(
    cost_model: CostModel, num_tokens: int, pp_size: int, block_size: int = 16, min_chunk: int = 0
) -> list[int]:
    """The chunks the CPP scheduler cuts a lone prompt of `num_tokens` into (no prefix hit)."""
    budget = prefill_budget(cost_model, num_tokens, pp_size, 0, block_size, min_chunk)
    return plan_chunks(num_tokens, cost_model, budget, block_size, min_chunk)
