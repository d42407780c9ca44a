# SPDX-License-Identifier: Apache-2.0
"""What any chunk plan can reach under a cost model: the yardsticks for CPP's measured results.

CPP picks one plan per prompt (equal-cost chunks, `vllm_omni.cpp.chunking`). To tell how far a
measured result is from what the machine allows, this module asks the cost model for the best
of ALL plans, and for what SLO-bound step lengths cost a long prefill:

- `best_plan`: the chunk plan with the shortest pipelined prefill. With equal-speed stages the
  makespan of any plan is sum(s_i) + (p - 1) * max(s_i) (`simulator.closed_form_makespan`), so
  for each cap M on a step's time a shortest-path search finds the least total work W(M) of a
  plan whose steps all fit M; the best plan minimises (p - 1) * M + W(M). Caps are scanned on a
  geometric grid (every distinct step time, so exactly, for small problems), and W is
  non-increasing in M, so the scan also yields a lower bound that no plan of `grid`-token
  chunks beats.
- `best_rendezvous_plan`: the same for vLLM's CPU pipeline, whose stages hand a chunk on only
  when the next stage takes it (`vllm_omni.cpp.handoff`): at p = 2 a plan takes sum(s_i) + s_1
  + the sum of its step-time rises, which a dynamic program minimises exactly.
- `single_stage_ttft`: plain PP=1 under a per-stage cost model of a p-stage split: every step
  runs all p stages' layers on one core but pays the step overhead once.
- `capped_plan`: the plan a long prefill gets when every step must fit `step_s`, as SLO-aware
  scheduling imposes while short requests with tight TTFT SLOs are around.
- `short_ttft_attainment`: the share of short requests arriving during such a prefill that can
  still meet a TTFT SLO of `slo_factor` x their unloaded TTFT (see its docstring).

Pure Python and numpy: no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_omni.cpp.chunking import plan_chunks
from vllm_omni.cpp.cost_model import CostModel, _check_int, _check_real
from vllm_omni.cpp.handoff import rendezvous_plan


@dataclass(frozen=True)
class PlanBound:
    makespan: float
    """Makespan of `chunks`, the best plan found."""
    lower_bound: float
    """No plan of grid-token chunks (the last may be shorter) has a shorter makespan."""
    chunks: tuple[int, ...]


def _costs(prompt_len: int, cost_model: CostModel, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Grid positions (token offsets) and step times s[i, j] of the chunk from position i to j
    (inf where j <= i)."""
    pos = np.unique(np.minimum(np.arange(0, prompt_len + grid, grid), prompt_len))
    cost = np.full((len(pos), len(pos)), np.inf)
    for i, start in enumerate(pos):
        for j in range(i + 1, len(pos)):
            size = int(pos[j] - start)
            cost[i, j] = cost_model.step_overhead + cost_model.chunk_cost(size, int(start))
    return pos, cost


def _least_work(cost: np.ndarray, cap: float) -> tuple[float, list[int]]:
    """Least sum of step times over plans whose every step fits `cap`, and that plan's grid
    positions (shortest path over the grid's DAG)."""
    n = cost.shape[0]
    work = np.full(n, np.inf)
    work[0] = 0.0
    parent = np.zeros(n, dtype=int)
    allowed = np.where(cost <= cap, cost, np.inf)
    for j in range(1, n):
        candidates = work[:j] + allowed[:j, j]
        parent[j] = int(np.argmin(candidates))
        work[j] = candidates[parent[j]]
    path, j = [n - 1], n - 1
    while j > 0 and np.isfinite(work[j]):
        j = parent[j]
        path.append(j)
    return float(work[-1]), path[::-1]


def best_plan(
    prompt_len: int, cost_model: CostModel, pp_size: int, grid: int = 64, num_caps: int = 200
) -> PlanBound:
    """The plan of `grid`-token chunks with the shortest makespan through `pp_size` equal stages
    (no communication time), with a lower bound for all such plans (module docstring)."""
    _check_int("prompt_len", prompt_len, 1)
    _check_int("pp_size", pp_size, 1)
    _check_int("grid", grid, 1)
    _check_int("num_caps", num_caps, 2)
    pos, cost = _costs(prompt_len, cost_model, grid)
    finite = cost[np.isfinite(cost)]
    # No plan has a step shorter than its cheapest way to cover the last grid cell.
    floor = float(np.min(cost[:-1, -1]))
    distinct = np.unique(finite[finite >= floor])
    exact = distinct.size <= num_caps
    if exact:  # small problems: every possible largest step is a cap
        caps = distinct
    else:
        caps = np.unique(np.concatenate([np.geomspace(floor, finite.max(), num_caps), [floor]]))
    works, paths = [], []
    for cap in caps:
        work, path = _least_work(cost, cap)
        works.append(work)
        paths.append(path)
    works_arr = np.array(works)
    totals = (pp_size - 1) * caps + works_arr
    best = int(np.argmin(totals))
    if exact:
        lower = float(totals.min())
    else:
        # Any plan's largest step M lies in [caps[k], caps[k + 1]) for some k (or beyond the
        # last cap): its makespan is >= (p - 1) * caps[k] + W(caps[k + 1]), as W never grows
        # with the cap.
        lower = min(((pp_size - 1) * caps[:-1] + works_arr[1:]).min(initial=np.inf), totals[-1])
    path = paths[best]
    chunks = tuple(int(pos[b] - pos[a]) for a, b in zip(path, path[1:]))
    steps = [float(cost[a, b]) for a, b in zip(path, path[1:])]
    makespan = sum(steps) + (pp_size - 1) * max(steps)
    return PlanBound(makespan=makespan, lower_bound=float(min(lower, makespan)), chunks=chunks)


def best_rendezvous_plan(
    prompt_len: int, cost_model: CostModel, grid: int = 128
) -> tuple[float, tuple[int, ...]]:
    """The plan of `grid`-token chunks (the last may be shorter) with the shortest makespan
    through 2 stages that hand chunks on by rendezvous, and that makespan: exact, the search of
    `handoff.rendezvous_plan` with no bound on a chunk's length."""
    _check_int("grid", grid, 1)
    chunks, makespan = rendezvous_plan(
        cost_model, prompt_len, block_size=grid, max_blocks=-(-prompt_len // grid)
    )
    return makespan, tuple(chunks)


def single_stage_ttft(prompt_len: int, cost_model: CostModel, chunk: int, pp_size: int) -> float:
    """Plain PP=1 prefill time in `chunk`-token steps, from a per-stage model of a `pp_size`-stage
    split: each step computes all pp_size stages' layers and pays the step overhead once."""
    _check_int("prompt_len", prompt_len, 1)
    _check_int("chunk", chunk, 1)
    _check_int("pp_size", pp_size, 1)
    total, pos = 0.0, 0
    while pos < prompt_len:
        size = min(chunk, prompt_len - pos)
        total += cost_model.step_overhead + pp_size * cost_model.chunk_cost(size, pos)
        pos += size
    return total


def capped_plan(prompt_len: int, cost_model: CostModel, step_s: float, grid: int = 1) -> list[int]:
    """Chunks (multiples of `grid` tokens) of a prefill whose every step takes at most `step_s`,
    each as large as fits; where not even one grid cell fits, the step takes one anyway (so it
    progresses): check the plan's `simulator.stage_times` against step_s."""
    _check_real("step_s", step_s, positive=True)
    return plan_chunks(prompt_len, cost_model, max(step_s - cost_model.step_overhead, 1e-12), grid)


def short_ttft_attainment(
    step_s: float,
    unloaded_ttft_s: Sequence[float],
    slo_factor: float = 3.0,
    slo_floor_s: float = 0.0,
) -> float:
    """Share of short requests, arriving at uniformly random times while a long prefill keeps
    both of two pipeline stages busy with steps of `step_s`, that meet a TTFT SLO of
    max(`slo_floor_s`, `slo_factor` x their unloaded TTFT u) (averaged over `unloaded_ttft_s`,
    one per kind of short request).

    A best case for the short request: it is scheduled as soon as stage 0 finishes the step in
    progress (residual R, uniform in [0, step_s)); no other step is queued ahead of it, and its
    own work is split evenly, u / 2 per stage. Its stage-1 half still waits for the long step
    that stage 1 took over when stage 0 finished it, so its TTFT is at least
    u + R + step_s - u / 2, which meets the SLO iff R <= SLO - u / 2 - step_s.
    """
    _check_real("step_s", step_s, positive=True)
    _check_real("slo_factor", slo_factor, positive=True)
    _check_real("slo_floor_s", slo_floor_s)
    if not unloaded_ttft_s:
        raise ValueError("unloaded_ttft_s must not be empty")
    shares = []
    for u in unloaded_ttft_s:
        _check_real("unloaded_ttft_s[]", u, positive=True)
        if slo_factor * u >= slo_floor_s:
            slack = (slo_factor - 0.5) * u - step_s
        else:
            slack = slo_floor_s - 0.5 * u - step_s
        shares.append(min(max(slack / step_s, 0.0), 1.0))
    return sum(shares) / len(shares)
