# SPDX-License-Identifier: Apache-2.0
"""DiffusionScheduler: which DiT requests run in the next engine step.

Two modes, chosen by registered name in the stage config:
- `fifo` (request-level): take the oldest waiting request and every waiting request that can
  share one whole-pipeline call with it (same size, steps and guidance), up to `max_num_seqs`;
  they run to completion in one engine step.
- `step` (step-level continuous batching): requests join and leave between denoising steps.
  Requests of equal image size share one transformer call whatever their step index, prompt
  length or guidance. Policy `fcfs`: requests are admitted in arrival order, up to
  `max_num_seqs`, and every engine step advances each of them by one step. Policy
  `deadline` (vllm_omni.diffusion.deadline): every engine step advances the most urgent
  request and more of its shape, then other shapes as far as the requests that can still meet
  their deadlines can spare the time, up to `max_num_seqs` in all; the rest wait, state kept.

Not to be confused with vLLM's own `vllm.v1.core.sched.diffusion_scheduler`, which serves
diffusion *language* models.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.deadline import (
    POLICIES,
    DeadlinePolicy,
    DeadlineUnreachable,
    SLOStats,
    StepCostModel,
    rows_of,
)
from vllm_omni.diffusion.request import DiTRequest, DiTRequestStatus

SCHEDULING_MODES = ("fifo", "step")


@dataclass(frozen=True)
class DiTSchedulerConfig:
    """`policy`: `fcfs` or `deadline` (step mode only). `admission_control`: refuse requests
    whose deadline cannot be met (deadline policy). `starvation_steps`: a request not
    advanced for this many engine steps goes first (deadline policy)."""

    mode: str = "step"
    max_num_seqs: int = 8
    policy: str = "fcfs"
    admission_control: bool = False
    starvation_steps: int = 64

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULING_MODES:
            raise ValueError(f"scheduler: must be one of {SCHEDULING_MODES}, got {self.mode!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {self.max_num_seqs}")
        if self.policy not in POLICIES:
            raise ValueError(f"scheduling_policy: must be one of {POLICIES}, got {self.policy!r}")
        if self.policy == "deadline" and self.mode != "step":
            raise ValueError("scheduling_policy: 'deadline' needs the 'step' scheduler")
        if self.admission_control and self.policy != "deadline":
            raise ValueError("admission_control: needs scheduling_policy 'deadline'")
        if not isinstance(self.starvation_steps, int) or self.starvation_steps < 1:
            raise ValueError(
                f"starvation_steps: must be an integer >= 1, got {self.starvation_steps!r}"
            )


@dataclass
class DiTSchedulerOutput:
    mode: str
    new_request_ids: list[str] = field(default_factory=list)  # to be prepared first
    groups: list[list[str]] = field(default_factory=list)  # each group: one batched call

    @property
    def is_empty(self) -> bool:
        return not self.groups


@dataclass
class DiTRunnerOutput:
    """`finished`: request id -> its result (images or latents). `step_seconds`: wall time of
    each group's call, in group order (in step mode its denoising step only: the deadline
    policy's step prices); `decode_seconds`: of the VAE decode that followed it, for the
    group's requests that finished (step mode). `failed`: request id -> why, for requests that
    failed alone (the others go on)."""

    finished: dict[str, object] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)
    decode_seconds: list[float] = field(default_factory=list)
    failed: dict[str, BaseException] = field(default_factory=dict)


class DiffusionScheduler:
    def __init__(
        self,
        config: DiTSchedulerConfig,
        cache: DiTCacheManager,
        estimate_bytes: Callable[[DiTRequest], int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock`: wall-clock seconds, the time base of deadlines (a virtual one in
        benchmarks/dit_sched_sim.py)."""
        self.config = config
        self.clock = clock
        self.cache = cache
        self._estimate_bytes = estimate_bytes
        self.waiting: deque[DiTRequest] = deque()
        self.running: list[DiTRequest] = []  # admitted: their state lives in the cache
        self.requests: dict[str, DiTRequest] = {}
        self.costs = StepCostModel()
        self.slo = SLOStats()
        self.deadline_policy = (
            DeadlinePolicy(self.costs, config.starvation_steps)
            if config.policy == "deadline"
            else None
        )
        self.engine_step = 0

    # ------------------------------------------------------------------ requests
    def add_request(self, request: DiTRequest) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already scheduled")
        if self.config.admission_control and not self.deadline_policy.admissible(
            request, list(self.requests.values()), self.clock()
        ):
            self.slo.rejected += 1
            raise DeadlineUnreachable(
                f"latency_slo_ms: cannot be met with the work queued ahead of this request "
                f"(its own steps take about {self.costs.remaining_s(request):.2f} s)"
            )
        request.last_advanced_step = self.engine_step
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> bool:
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request.status == DiTRequestStatus.WAITING:
            self.waiting.remove(request)
        else:
            self.running.remove(request)
        request.status = DiTRequestStatus.ABORTED
        self.cache.release(request_id)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ------------------------------------------------------------------ scheduling
    def schedule(self) -> DiTSchedulerOutput:
        if self.config.mode == "fifo":
            return self._schedule_requests()
        return self._schedule_steps()

    def _admit(self, request: DiTRequest) -> None:
        request.status = DiTRequestStatus.RUNNING
        self.running.append(request)

    def _schedule_steps(self) -> DiTSchedulerOutput:
        if self.deadline_policy is not None:
            return self._schedule_by_deadline()
        out = DiTSchedulerOutput(mode="step")
        admitted, admitted_bytes = 0, 0  # their entries are allocated by the runner later
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            head = self.waiting[0]
            need = self._estimate_bytes(head)
            if not self.cache.can_allocate(admitted_bytes + need, pending_entries=admitted):
                break  # FIFO: nobody overtakes a request waiting for memory
            admitted, admitted_bytes = admitted + 1, admitted_bytes + need
            self.waiting.popleft()
            self._admit(head)
            out.new_request_ids.append(head.request_id)
        by_shape: dict[tuple[int, int], list[str]] = {}
        for request in self.running:  # oldest first, so the oldest shape runs first
            by_shape.setdefault(request.shape_key, []).append(request.request_id)
        out.groups = list(by_shape.values())
        return out

    def _schedule_by_deadline(self) -> DiTSchedulerOutput:
        """The most urgent request that can run, and the next most urgent of its shape, as
        long as the step stays shorter than the slack of the most urgent request of another
        shape (a big batch would otherwise make it wait past its deadline); then other shapes
        in the same step, as far as every request that can still meet its deadline can spare
        the time (`_spare_groups`)."""
        out = DiTSchedulerOutput(mode="step")
        now = self.clock()
        policy = self.deadline_policy
        candidates = self.running + list(self.waiting)
        ordered = policy.order(candidates, now, self.engine_step)
        shape, picked, budget_s, step_s = None, [], float("inf"), 0.0
        admitted, admitted_bytes = 0, 0
        for request in ordered:
            if len(picked) >= self.config.max_num_seqs:
                break
            if shape is not None and request.shape_key != shape:
                budget_s = min(budget_s, max(0.0, policy.slack(request, now)))
                continue
            cost_s = self.costs.step_s(request)
            if picked and step_s + cost_s > budget_s:
                break
            if request.status == DiTRequestStatus.WAITING:
                need = self._estimate_bytes(request)
                if not self.cache.can_allocate(admitted_bytes + need, pending_entries=admitted):
                    continue  # waits for memory; a later, smaller request may fit
                admitted, admitted_bytes = admitted + 1, admitted_bytes + need
                self.waiting.remove(request)
                self._admit(request)
                out.new_request_ids.append(request.request_id)
            shape = request.shape_key
            picked.append(request.request_id)
            step_s += cost_s
        if picked:
            out.groups = [picked]
            spare = self._spare_groups(ordered, shape, len(picked), now, admitted, admitted_bytes)
            for request in spare:
                if request.status == DiTRequestStatus.WAITING:
                    self.waiting.remove(request)
                    self._admit(request)
                    out.new_request_ids.append(request.request_id)
            by_shape: dict[tuple, list[str]] = {}
            for request in spare:
                by_shape.setdefault(request.shape_key, []).append(request.request_id)
            out.groups += list(by_shape.values())
        return out

    def _spare_groups(
        self,
        ordered: list[DiTRequest],
        shape: tuple,
        num_picked: int,
        now: float,
        admitted: int,
        admitted_bytes: int,
    ) -> list[DiTRequest]:
        """Requests of other shapes that can ride along in this step, most urgent first. Each
        extra transformer call delays every request's step by its cost; taking that delay in
        every remaining step, a request that can still meet its deadline must still meet it
        (`DeadlinePolicy.spare_per_step_s`). The others are past saving under this load: for
        them, and when nobody is in a hurry, the step advances as many requests as fcfs would,
        which keeps the throughput when the stage is overloaded."""
        spare_s = self.deadline_policy.spare_per_step_s(ordered, now)
        extra_s, spare = 0.0, []
        for request in ordered:
            if num_picked + len(spare) >= self.config.max_num_seqs:
                break
            if request.shape_key == shape:
                continue  # left out of the first group on purpose (its budget)
            cost_s = self.costs.step_s(request)
            if extra_s + cost_s > spare_s:
                break
            if request.status == DiTRequestStatus.WAITING:
                need = self._estimate_bytes(request)
                if not self.cache.can_allocate(admitted_bytes + need, pending_entries=admitted):
                    continue
                admitted, admitted_bytes = admitted + 1, admitted_bytes + need
            spare.append(request)
            extra_s += cost_s
        return spare

    def _schedule_requests(self) -> DiTSchedulerOutput:
        out = DiTSchedulerOutput(mode="fifo")
        if self.running or not self.waiting:
            return out
        key = self.waiting[0].pipeline_key
        batch = [r for r in self.waiting if r.pipeline_key == key][: self.config.max_num_seqs]
        for request in batch:
            self.waiting.remove(request)
            self._admit(request)
            out.new_request_ids.append(request.request_id)
        out.groups = [[r.request_id for r in batch]]
        return out

    def update_from_output(
        self, scheduled: DiTSchedulerOutput, output: DiTRunnerOutput
    ) -> list[tuple[DiTRequest, object]]:
        """Advance step counters; return (request, result) for each request that finished."""
        finished = []
        now = self.clock()
        for i, group in enumerate(scheduled.groups):
            requests = [self.requests[rid] for rid in group if rid in self.requests]
            if scheduled.mode == "step" and requests and i < len(output.step_seconds):
                rows = sum(rows_of(r) for r in requests)
                self.costs.observe(requests[0].shape_key, rows, output.step_seconds[i])
                decoded = any(r.request_id in output.finished for r in requests)
                if decoded and i < len(output.decode_seconds):
                    self.costs.observe_decode(requests[0].shape_key, output.decode_seconds[i])
            for request_id in group:
                request = self.requests.get(request_id)
                if request is None:  # aborted while its step ran
                    continue
                request.last_advanced_step = self.engine_step
                if scheduled.mode == "step":
                    request.num_steps_done += 1
                if request_id in output.finished:
                    request.status = DiTRequestStatus.FINISHED
                    request.num_steps_done = request.num_steps
                    self.running.remove(request)
                    del self.requests[request_id]
                    self.cache.release(request_id)
                    self.slo.finished(request, now)
                    finished.append((request, output.finished[request_id]))
        self.engine_step += 1
        return finished
