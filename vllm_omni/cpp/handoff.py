# SPDX-License-Identifier: Apache-2.0
"""Chunk plans for a two-stage pipeline that hands chunks on by rendezvous, as vLLM 0.32's CPU
pipeline does: a stage's send of its activations spins until the next stage takes them, so a
stage may start chunk i + 1 only once the next stage has started chunk i.

With step times s_1..s_m on both stages such a prefill takes (derivation:
`vllm_omni.cpp.simulator`)

    sum(s_i) + s_1 + sum(max(0, s_i - s_{i-1}))

so every rise of the step time from one chunk to the next costs its size. Equal-cost chunks
would lose nothing, but chunks are whole KV blocks, and at a long context one block is 10-25% of
a step: equal-cost plans saw-tooth. `rendezvous_plan` instead cuts the plan of block-aligned
chunks that minimises that makespan under the cost model, by dynamic programming over (previous
chunk, chunk): a few larger chunks at small contexts, then chunks whose time only falls or rises
by the growing context.
"""

from __future__ import annotations

import numpy as np

from vllm_omni.cpp.cost_model import CostModel, _check_int

MAX_CHUNK_BLOCKS = 64
"""Longest chunk the search considers, in blocks (8192 tokens at vLLM's 128-token CPU block): the
search takes O(n * b^2) for n blocks of prompt and b of chunk."""


def step_times(cost_model: CostModel, positions: np.ndarray, max_blocks: int) -> np.ndarray:
    """times[i, d - 1]: step time of the chunk from positions[i] to positions[i + d] (inf past
    the end), step_overhead included."""
    n = len(positions)
    start = positions[:-1, None].astype(float)
    end_index = np.arange(n - 1)[:, None] + np.arange(1, max_blocks + 1)[None, :]
    valid = end_index < n
    x = np.where(valid, positions[np.minimum(end_index, n - 1)] - start, 0.0)
    cost = cost_model.step_overhead + cost_model.chunk_costs(x, start)
    return np.where(valid, cost, np.inf)


def rendezvous_plan(
    cost_model: CostModel,
    num_tokens: int,
    start: int = 0,
    block_size: int = 128,
    max_blocks: int = MAX_CHUNK_BLOCKS,
) -> tuple[list[int], float]:
    """The block-aligned chunks covering tokens start..num_tokens (the last one the remainder)
    with the shortest two-stage rendezvous makespan, and that makespan (in the cost model's
    unit). Exact among plans whose chunks are at most `max_blocks` blocks."""
    for name, value, low in (
        ("num_tokens", num_tokens, 1),
        ("start", start, 0),
        ("block_size", block_size, 1),
        ("max_blocks", max_blocks, 1),
    ):
        _check_int(name, value, low)
    if start >= num_tokens:
        raise ValueError(f"start ({start}) must be below num_tokens ({num_tokens})")
    positions = np.unique(np.append(np.arange(start, num_tokens, block_size), num_tokens))
    last = len(positions) - 1
    band = min(max_blocks, last)
    times = step_times(cost_model, positions, band)
    # rest[i, d - 1]: the least time still to come once the chunk from i to i + d has run; each
    # later chunk costs its step time plus how far it rises above the chunk before it.
    rest = np.full((last, band), np.inf)
    choice = np.zeros((last, band), dtype=int)
    ends = np.arange(last - band, last)  # the chunks that can end the prefill
    rest[ends, last - ends - 1] = 0.0
    for j in range(last - 1, 0, -1):
        after = times[j]  # the chunks from j, by length
        lengths = np.arange(1, min(band, j) + 1)
        before = times[j - lengths, lengths - 1][:, None]  # the chunks ending at j
        total = after + np.maximum(after - before, 0.0) + rest[j]
        best = np.argmin(total, axis=1)
        rest[j - lengths, lengths - 1] = total[np.arange(len(lengths)), best]
        choice[j - lengths, lengths - 1] = best + 1
    first = 2.0 * times[0] + rest[0]
    length = int(np.argmin(first)) + 1
    makespan = float(first[length - 1])
    cuts = [0, length]
    while cuts[-1] != last:
        i, j = cuts[-2], cuts[-1]
        cuts.append(j + int(choice[i, j - i - 1]))
    return [int(positions[b] - positions[a]) for a, b in zip(cuts, cuts[1:])], makespan
