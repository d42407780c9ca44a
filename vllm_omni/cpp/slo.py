# SPDX-License-Identifier: Apache-2.0
"""SLO-aware sharing of a step's compute budget among prefills (smallest remaining first, deadlines
guarded).

Pure policy, no vLLM: the CPPScheduler builds one `PrefillDemand` per prefill that could run in
the next step (running chunked prefills and waiting requests), and this module decides the
order and how much of the step's compute each may take.

- Smallest remaining prefill first (SRPT): a short prompt served ahead of a long prefill costs
  the long one a few percent of its TTFT, while a long chunk ahead of the short one can cost it
  all of its SLO.
- Except a request that can still meet its TTFT SLO but would miss it by yielding one more step
  (its slack, the deadline less now and its predicted time to first token, is under one step):
  it goes first. Late requests are not urgent: they keep their SRPT rank. Ordering by least
  relative slack instead (slack / SLO, cf. Medha's LARS) let a long prompt that was late, or
  nearly so, hold every short request back until it was as late in relative terms: on
  `benchmarks/slo_mixed.py`'s interactive regime short requests met their 1 s SLO less often than
  under plain CPP (28-52% against 52-86%, docs/results/slo_mixed_zen5_*.json), and its 32K
  prompt took 1.38-1.52x its solo TTFT.
- Requests without a TTFT SLO come after those with one.
- `priority` (vLLM's: lower is more important) ranks before all of these.
- Starvation guard: a request that has waited `max_wait_s` goes to the front.
- The step budget is capped so that a newly arrived request can still meet the tightest TTFT
  SLO in play: it waits behind the steps already in flight (`steps_in_flight`), so each step may
  take at most SLO / (steps in flight + 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TTFT_SLO_ARG = "ttft_slo_ms"
TPOT_SLO_ARG = "tpot_slo_ms"
"""Per-request SLOs in SamplingParams.extra_args (OpenAI API: `vllm_xargs`), in milliseconds."""


@dataclass(frozen=True)
class SLOTargets:
    ttft_s: float | None = None
    tpot_s: float | None = None

    @classmethod
    def from_ms(cls, ttft_ms: float | None, tpot_ms: float | None) -> SLOTargets:
        """Server-wide defaults as configured (`cpp.ttft_slo_ms`, `cpp.tpot_slo_ms`)."""
        return cls(
            ttft_s=ttft_ms / 1000 if ttft_ms else None,
            tpot_s=tpot_ms / 1000 if tpot_ms else None,
        )


def request_slo(extra_args: Mapping[str, Any] | None, defaults: SLOTargets) -> SLOTargets:
    """A request's SLOs: its own (`vllm_xargs`), else the server's defaults. Raises ValueError
    naming the field for anything but a positive number."""
    extra_args = extra_args or {}
    values = {}
    for arg, default in ((TTFT_SLO_ARG, defaults.ttft_s), (TPOT_SLO_ARG, defaults.tpot_s)):
        value = extra_args.get(arg)
        if value is None:
            values[arg] = default
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(
                f"vllm_xargs.{arg}: must be a positive number of ms, got {value!r:.40}"
            )
        try:
            ms = float(value)
        except OverflowError:  # an int too large for any float
            ms = math.inf
        if not math.isfinite(ms):
            raise ValueError(f"vllm_xargs.{arg}: must be finite, got {value!r:.40}")
        values[arg] = ms / 1000  # may round to 0.0 for a subnormal ms: such a request is late
    return SLOTargets(ttft_s=values[TTFT_SLO_ARG], tpot_s=values[TPOT_SLO_ARG])


@dataclass(frozen=True)
class PrefillDemand:
    """One prefill competing for the next step. Costs are in the cost model's unit (seconds
    when calibrated). `step_cost`: what it would take this step on its own (its CPP chunk);
    `remaining_cost`: what is left of its whole prefill."""

    request_id: str
    arrival: float
    priority: int
    ttft_s: float | None
    step_cost: float
    remaining_cost: float
    min_cost: float = 0.0  # its smallest chunk (one KV block, or the rest)


def slack(demand: PrefillDemand, now: float, step_s: float, pp_size: int) -> float:
    """Seconds left before the TTFT deadline after the predicted remaining work (negative:
    already late). The prediction: the prefill's remaining cost, plus the pipeline's other
    stages (pp_size - 1 steps)."""
    if demand.ttft_s is None:
        return math.inf
    predicted = demand.remaining_cost + (pp_size - 1) * step_s
    return demand.arrival + demand.ttft_s - now - predicted


def order(
    demands: Iterable[PrefillDemand],
    now: float,
    step_s: float,
    pp_size: int,
    max_wait_s: float,
) -> list[PrefillDemand]:
    """Most urgent first: starved, then by priority, then those that would miss their TTFT SLO
    by waiting one more step (while they can still meet it), then those with a TTFT SLO, then
    smallest remaining prefill, then arrival."""

    def key(d: PrefillDemand):
        starved = now - d.arrival >= max_wait_s
        urgent = 0 <= slack(d, now, step_s, pp_size) < step_s
        return (not starved, d.priority, not urgent, d.ttft_s is None, d.remaining_cost, d.arrival)

    return sorted(demands, key=key)


def step_budget_cap(ttft_slos: Iterable[float | None], steps_in_flight: int) -> float:
    """The largest step cost that still lets a request arriving now meet the tightest TTFT SLO:
    it waits for the steps in flight, then needs its own."""
    tightest = min((t for t in ttft_slos if t is not None), default=None)
    if tightest is None:
        return math.inf
    return tightest / (steps_in_flight + 1)


def allocate(ordered: list[PrefillDemand], budget: float) -> dict[str, float]:
    """Walk the prefills in urgency order, each taking what it needs of the step (its step
    cost) while budget lasts; one whose smallest chunk no longer fits is skipped, so a smaller
    one behind it may still fit. The first always gets at least its smallest chunk, so
    something progresses even when the budget is tight."""
    allowances: dict[str, float] = {}
    left = budget
    for i, demand in enumerate(ordered):
        give = min(demand.step_cost, left)
        if i == 0:
            give = max(give, demand.min_cost)
        elif give <= 0 or give < demand.min_cost:
            continue
        allowances[demand.request_id] = give
        left -= give
    return allowances
