# SPDX-License-Identifier: Apache-2.0
"""SLO-aware sharing of a step's compute budget among prefills (least relative slack first).

Pure policy, no vLLM: the CPPScheduler builds one `PrefillDemand` per prefill that could run in
the next step (running chunked prefills and waiting requests), and this module decides the
order and how much of the step's compute each may take.

- Relative slack (cf. Medha's LARS): (deadline - now - predicted time to first token) / TTFT
  SLO. A short request that just arrived with a tight SLO has little relative slack; a long
  prefill with a generous SLO has plenty, so it yields part of the step to the short one.
- Requests without a TTFT SLO come after those with one, first come first served.
- `priority` (vLLM's: lower is more important) ranks before slack.
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
        values[arg] = ms / 1000  # may round to 0.0 for a subnormal ms: relative_slack copes
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


def relative_slack(demand: PrefillDemand, now: float, step_s: float, pp_size: int) -> float:
    """Time left before the TTFT deadline after the predicted remaining work, as a fraction of
    the SLO (negative: already late). The prediction: the prefill's remaining cost, plus the
    pipeline's other stages (pp_size - 1 steps)."""
    if demand.ttft_s is None:
        return math.inf
    if demand.ttft_s <= 0:  # a positive SLO in ms so small that it is 0.0 s: as late as can be
        return -math.inf
    predicted = demand.remaining_cost + (pp_size - 1) * step_s
    return (demand.arrival + demand.ttft_s - now - predicted) / demand.ttft_s


def order(
    demands: Iterable[PrefillDemand],
    now: float,
    step_s: float,
    pp_size: int,
    max_wait_s: float,
) -> list[PrefillDemand]:
    """Most urgent first: starved, then by priority, relative slack, arrival."""

    def key(d: PrefillDemand):
        starved = now - d.arrival >= max_wait_s
        return (not starved, d.priority, relative_slack(d, now, step_s, pp_size), d.arrival)

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
