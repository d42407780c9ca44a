# SPDX-License-Identifier: Apache-2.0
"""Deadline-aware step scheduling for the DiT stage: least slack first.

A request with a latency SLO carries a deadline (wall-clock, set when it entered the omni
engine). Its slack is the time left before the deadline minus the time its remaining steps
need, priced by `StepCostModel` (measured seconds per row-step of each image shape). At every
step boundary the scheduler advances the most urgent request and the requests of the same
shape that come next in urgency order (one transformer call), then requests of other shapes as
far as every request that can still meet its deadline can spare the time; the others keep their
state in the DiT cache and wait (preemption at step boundaries, nothing recomputed). Urgency:

1. starved requests (not advanced for `starvation_steps` engine steps), longest idle first;
2. the others by the time they can spare: a request that can still meet its deadline by its
   slack (no SLO: infinite); a late request (it can no longer meet its deadline) by its own
   remaining work plus that of every late request with less (late requests go least work
   first). So late requests run in the slack of the on-time requests behind them, all of them
   together, and finish as early as that allows; an on-time request whose slack is less than
   that late work goes first. Late requests also ride along in steps whose other requests can
   spare the time (the scheduler's `_spare_groups`). Comparing an on-time request's
   slack with one late request's work instead would let a queue of late requests spend that
   slack together and turn on-time requests late in a cascade.

Admission control (optional) refuses, at arrival, a request that cannot finish in time even
if it ran before every request with a later deadline (an EDF feasibility check).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from vllm_omni.diffusion.request import DiTRequest

POLICIES = ("fcfs", "deadline")
EMA = 0.3  # weight of the newest measurement of a shape's row-step cost


class DeadlineUnreachable(Exception):
    """Admission control refused a request whose deadline cannot be met (HTTP 429)."""


def rows_of(request: DiTRequest) -> int:
    """Transformer rows one step of `request` takes, as its parameters declare."""
    return request.params.rows


class StepCostModel:
    """Seconds per row-step of each shape, from the measured wall time of batched steps, and
    seconds of the VAE decode that ends a request of each shape (a decode of a batch counts
    once: it costs about what one image's does on a CPU, and it holds up every request behind
    it as long). A shape never measured is priced from measured ones by its pixel count (0
    before any)."""

    def __init__(self) -> None:
        self.row_seconds: dict[tuple, float] = {}
        self.decode_seconds: dict[tuple, float] = {}

    def observe(self, shape: tuple, rows: int, seconds: float) -> None:
        if rows > 0 and seconds > 0:
            _update(self.row_seconds, shape, seconds / rows)

    def observe_decode(self, shape: tuple, seconds: float) -> None:
        if seconds > 0:
            _update(self.decode_seconds, shape, seconds)

    def row_step(self, shape: tuple) -> float:
        return _priced(self.row_seconds, shape)

    def decode_s(self, shape: tuple) -> float:
        return _priced(self.decode_seconds, shape)

    def step_s(self, request: DiTRequest) -> float:
        """What advancing `request` by one step adds to an engine step (its decode too, if it
        is the last)."""
        last = request.num_steps - request.num_steps_done <= 1
        shape = request.shape_key
        return rows_of(request) * self.row_step(shape) + (self.decode_s(shape) if last else 0.0)

    def remaining_s(self, request: DiTRequest) -> float:
        """Its remaining denoising steps, then its decode."""
        steps = request.num_steps - request.num_steps_done
        shape = request.shape_key
        return steps * rows_of(request) * self.row_step(shape) + self.decode_s(shape)


def _update(values: dict[tuple, float], shape: tuple, value: float) -> None:
    old = values.get(shape)
    values[shape] = value if old is None else (1 - EMA) * old + EMA * value


def _priced(values: dict[tuple, float], shape: tuple) -> float:
    if shape in values:
        return values[shape]
    known = [(s, v) for s, v in values.items() if _pixels(s)]
    if not known or not _pixels(shape):
        return 0.0
    return max(v / _pixels(s) for s, v in known) * _pixels(shape)


def _pixels(shape: tuple) -> int:
    """The output pixels of a step key (height, width[, an edit's input sizes])."""
    if len(shape) >= 2 and all(isinstance(v, int) for v in shape[:2]):
        return shape[0] * shape[1]
    return 0


@dataclass
class SLOStats:
    """Outcomes of requests with a deadline, for /metrics."""

    met: int = 0
    missed: int = 0
    rejected: int = 0
    recent_slack_s: deque = field(default_factory=lambda: deque(maxlen=256))

    def finished(self, request: DiTRequest, now: float) -> None:
        deadline = request.deadline
        if deadline is None:
            return
        slack = deadline - now
        self.recent_slack_s.append(slack)
        if slack >= 0:
            self.met += 1
        else:
            self.missed += 1

    def as_dict(self) -> dict[str, float]:
        slack = statistics.median(self.recent_slack_s) if self.recent_slack_s else 0.0
        return {
            "slo_met": self.met,
            "slo_missed": self.missed,
            "slo_rejected": self.rejected,
            "slo_slack_p50_s": slack,
        }


class DeadlinePolicy:
    def __init__(self, costs: StepCostModel, starvation_steps: int) -> None:
        self.costs = costs
        self.starvation_steps = starvation_steps

    def slack(self, request: DiTRequest, now: float) -> float:
        if request.deadline is None:
            return math.inf
        return request.deadline - now - self.costs.remaining_s(request)

    def order(self, requests: list[DiTRequest], now: float, engine_step: int) -> list:
        """Most urgent first (see the module docstring)."""
        slack = {r.request_id: self.slack(r, now) for r in requests}
        late = sorted(
            (r for r in requests if slack[r.request_id] < 0),
            key=lambda r: (self.costs.remaining_s(r), r.arrival),
        )
        # A late request with the work of the late requests before it: an on-time request
        # with more slack than that can let all of them finish first.
        late_work, work = {}, 0.0
        for r in late:
            work += self.costs.remaining_s(r)
            late_work[r.request_id] = work

        def urgency(r: DiTRequest) -> tuple:
            idle = engine_step - r.last_advanced_step
            if idle > self.starvation_steps:
                return (0, -idle, 0, r.arrival)
            if r.request_id in late_work:
                return (1, late_work[r.request_id], 1, r.arrival)
            return (1, slack[r.request_id], 0, r.arrival)

        return sorted(requests, key=urgency)

    def spare_per_step_s(self, requests: list[DiTRequest], now: float) -> float:
        """How much longer every step may take without making late a request that can still be
        on time: the least, over such requests, of the room they have left (by the EDF test
        below: the remaining work of every request due no later than it, then its own, done
        back to back from now) per remaining step. Infinite when no such request."""
        per_step, ahead_s = [], 0.0
        for r in sorted((r for r in requests if r.deadline is not None), key=lambda r: r.deadline):
            ahead_s += self.costs.remaining_s(r)
            room_s = r.deadline - now - ahead_s
            if room_s >= 0:
                per_step.append(room_s / max(1, r.num_steps - r.num_steps_done))
        return min(per_step, default=math.inf)

    def admissible(self, request: DiTRequest, others: list[DiTRequest], now: float) -> bool:
        """EDF check: the work of every request due no later than `request`, then its own,
        done back to back from now, ends by its deadline."""
        if request.deadline is None:
            return True
        ahead = sum(
            self.costs.remaining_s(r)
            for r in others
            if r.deadline is not None and r.deadline <= request.deadline
        )
        return now + ahead + self.costs.remaining_s(request) <= request.deadline
