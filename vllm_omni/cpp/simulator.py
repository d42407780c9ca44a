# SPDX-License-Identifier: Apache-2.0
"""Discrete-event model of one request's chunked prefill flowing through p pipeline stages.

Chunk i (x_i new tokens after L_i cached ones) takes the same time on every stage,
s_i = cost_model.chunk_cost(x_i, L_i) + cost_model.step_overhead: the cost model is already per
stage (the heaviest stage of a balanced layer split). Chunk i may start on stage k once it has
left stage k-1 (plus `comm_s` for the activation send) and once stage k has finished chunk i-1:

    start[i][k] = max(end[i][k-1] + comm_s, end[i-1][k]),   end[i][k] = start[i][k] + s_i

Times are in the cost model's unit (FLOP for `CostModel.analytic`, seconds for a fitted model);
`comm_s` must be in that same unit. Pure Python: no torch, no vLLM.

Closed form. This is a proportionate flow shop, and its makespan is the longest path through the
(chunk, stage) grid. A monotone path visits chunk i on n_i >= 1 consecutive stages with
sum(n_i) = m + p - 1 cells and makes exactly p - 1 stage hops, so its length is
sum(n_i * s_i) + (p - 1) * comm_s, maximised by spending all p - 1 extra cells on the slowest
chunk:

    makespan = sum(s_i) + (p - 1) * (max(s_i) + comm_s)

exactly, for ANY order of chunk times (growing, shrinking or mixed) - not only non-decreasing
ones. It stops being exact only when the model changes: stages with different speeds, or a cap
on chunks in flight (`max_in_flight` = W; vLLM's batch queue holds pp_size steps). With
comm_s == 0 and W >= p the cap never binds for non-decreasing chunk times (chunk i + W reaches
stage 0 after the W - 1 >= p - 1 chunks behind i, each at least s_i long, by which time chunk i
has left the last stage), nor, checked numerically, for non-increasing ones. Mixed orders can
bind even at W = p: p = W = 5 with times (19, 10, 15, 3, 20, 13, 11, 19, 8) takes 223, not 198.
This matters for balanced plans: block rounding jitters their chunk costs by a few percent, and
at W = p that jitter stalls stage 0 (Llama-3-8B, 1M tokens, p = 16: bubble 2.1% instead of
1.5%); W = p + 1 absorbs it. comm_s > 0 or W < p can also make the cap bind.

Hand-off (`rendezvous=True`). vLLM 0.32's CPU pipeline does not buffer between stages: a
stage's send of its activations (shared memory, `shm_send_tensor_list`) spins until the next
stage takes them, which that stage does when it starts the chunk, so stage k is free for chunk
i + 1 only once stage k + 1 has started chunk i. Measured on CPU, TTFT follows this model
within about 1% and the free-flowing one not (docs/cpp.md). For p = 2 it has a closed form too:
the second stage starts chunk i at T_i = T_{i-1} + max(s_i, s_{i-1}), so

    makespan = sum(s_i) + s_1 + sum(max(0, s_i - s_{i-1}))

every rise of the step time from one chunk to the next costs its size, and equal chunks are no
worse than before, (m + 1) * s, but the jitter of block rounding is no longer free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from vllm_omni.cpp.cost_model import CostModel, _check_int, _check_real


class Span(NamedTuple):
    """One chunk's stay on one stage, in the cost model's unit (start <= end)."""

    stage: int
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    """Outcome of `simulate`. Times in the cost model's unit (FLOP or seconds).

    makespan: end of the last chunk on the last stage (the prefill's share of TTFT).
    busy: per stage, the time it computes (the same sum(s_i) on every stage here).
    bubble: idle share of the p * makespan stage-time, 1 - sum(busy) / (p * makespan).
    timeline: timeline[i][k] is chunk i's Span on stage k (for Gantt plots).
    ideal_bubble: (p - 1) / (m + p - 1), the bubble of m equal chunks with comm_s == 0.
    stage_times: s_i per chunk, step_overhead included.
    """

    makespan: float
    busy: tuple[float, ...]
    bubble: float
    timeline: tuple[tuple[Span, ...], ...]
    ideal_bubble: float
    stage_times: tuple[float, ...]

    @property
    def pp_size(self) -> int:
        return len(self.busy)

    @property
    def num_chunks(self) -> int:
        return len(self.stage_times)

    @property
    def idle(self) -> float:
        """Total idle stage-time, p * makespan - sum(busy), in the cost model's unit."""
        return self.pp_size * self.makespan - sum(self.busy)


def fixed_chunks(prompt_len: int, chunk: int) -> list[int]:
    """Chunks of `chunk` tokens covering `prompt_len`, the last one the (shorter) remainder."""
    _check_int("prompt_len", prompt_len, 0)
    _check_int("chunk", chunk, 1)
    full, rest = divmod(prompt_len, chunk)
    return [chunk] * full + ([rest] if rest else [])


def ideal_bubble(num_chunks: int, pp_size: int) -> float:
    """(p - 1) / (m + p - 1): the bubble of m equal-time chunks through p stages (GPipe)."""
    _check_int("num_chunks", num_chunks, 1)
    _check_int("pp_size", pp_size, 1)
    return (pp_size - 1) / (num_chunks + pp_size - 1)


def stage_times(chunks: Sequence[int], cost_model: CostModel, start: int = 0) -> list[float]:
    """Per-stage time s_i of each chunk, each after the `start` + earlier chunks' tokens."""
    _check_int("start", start, 0)
    times, pos = [], start
    for size in chunks:
        _check_int("chunks[]", size, 1)
        times.append(cost_model.chunk_cost(size, pos) + cost_model.step_overhead)
        pos += size
    return times


def closed_form_makespan(
    chunks: Sequence[int], cost_model: CostModel, pp_size: int, start: int = 0, comm_s: float = 0.0
) -> float:
    """sum(s_i) + (p - 1) * (max(s_i) + comm_s): equals `simulate(...).makespan` (up to float
    rounding) for every chunk order when max_in_flight is None (proof: module docstring)."""
    _check_int("pp_size", pp_size, 1)
    _check_real("comm_s", comm_s)
    times = stage_times(chunks, cost_model, start)
    if not times:
        raise ValueError("chunks must not be empty")
    return sum(times) + (pp_size - 1) * (max(times) + comm_s)


def simulate(
    chunks: Sequence[int],
    cost_model: CostModel,
    pp_size: int,
    start: int = 0,
    comm_s: float = 0.0,
    max_in_flight: int | None = None,
    rendezvous: bool = False,
) -> SimResult:
    """Run chunk sizes `chunks` (tokens, in order, after `start` cached tokens) through
    `pp_size` equal-speed stages. See the module docstring for the timing rule.

    `max_in_flight` (None: unbounded, the textbook flow shop) caps how many chunks are between
    entering stage 0 and leaving the last stage, as vLLM's engine does with its batch queue of
    pp_size steps: chunk i may not start on stage 0 before chunk i - max_in_flight has left the
    last stage (plus comm_s for the result's trip back to the scheduler).

    `rendezvous`: a stage hands a chunk on only when the next stage takes it (module docstring:
    vLLM's CPU pipeline); False: unbounded buffers between stages.
    """
    _check_int("pp_size", pp_size, 1)
    _check_real("comm_s", comm_s)
    if max_in_flight is not None:
        _check_int("max_in_flight", max_in_flight, 1)
    times = stage_times(chunks, cost_model, start)
    if not times:
        raise ValueError("chunks must not be empty")
    timeline: list[tuple[Span, ...]] = []
    free = [0.0] * pp_size  # when each stage may start its next chunk
    for i, s in enumerate(times):
        spans, ready = [], 0.0  # ready: when this chunk's input is available to the stage
        if max_in_flight is not None and i >= max_in_flight:
            ready = timeline[i - max_in_flight][-1].end + comm_s
        for k in range(pp_size):
            begin = max(ready, free[k])
            spans.append(Span(k, begin, begin + s))
            free[k] = begin + s
            if rendezvous and k > 0:
                free[k - 1] = begin  # the previous stage's send completes as this stage takes it
            ready = begin + s + comm_s
        timeline.append(tuple(spans))
    makespan = timeline[-1][-1].end
    busy = sum(times)
    # Every stage computes every chunk once, so busy time is the same on each stage.
    return SimResult(
        makespan=makespan,
        busy=(busy,) * pp_size,
        bubble=1.0 - busy / makespan if makespan > 0 else 0.0,
        timeline=tuple(timeline),
        ideal_bubble=ideal_bubble(len(times), pp_size),
        stage_times=tuple(times),
    )
