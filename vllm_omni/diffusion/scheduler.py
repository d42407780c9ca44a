# SPDX-License-Identifier: Apache-2.0
"""DiffusionScheduler: which DiT requests run in the next engine step.

Two modes, chosen by registered name in the stage config:
- `fifo` (request-level): take the oldest waiting request and every waiting request that can
  share one whole-pipeline call with it (same size, steps and guidance), up to `max_num_seqs`;
  they run to completion in one engine step.
- `step` (step-level continuous batching): requests join and leave between denoising steps.
  Every engine step advances each running request by one step; requests of equal image size
  share one transformer call whatever their step index, prompt length or guidance.

Not to be confused with vLLM's own `vllm.v1.core.sched.diffusion_scheduler`, which serves
diffusion *language* models.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.request import DiTRequest, DiTRequestStatus

SCHEDULING_MODES = ("fifo", "step")


@dataclass(frozen=True)
class DiTSchedulerConfig:
    mode: str = "step"
    max_num_seqs: int = 8

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULING_MODES:
            raise ValueError(f"scheduler: must be one of {SCHEDULING_MODES}, got {self.mode!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {self.max_num_seqs}")


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
    each batched call, in group order (for metrics and timelines)."""

    finished: dict[str, object] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)


class DiffusionScheduler:
    def __init__(
        self,
        config: DiTSchedulerConfig,
        cache: DiTCacheManager,
        estimate_bytes: Callable[[DiTRequest], int],
    ) -> None:
        self.config = config
        self.cache = cache
        self._estimate_bytes = estimate_bytes
        self.waiting: deque[DiTRequest] = deque()
        self.running: list[DiTRequest] = []
        self.requests: dict[str, DiTRequest] = {}

    # ------------------------------------------------------------------ requests
    def add_request(self, request: DiTRequest) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already scheduled")
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
        for group in scheduled.groups:
            for request_id in group:
                request = self.requests.get(request_id)
                if request is None:  # aborted while its step ran
                    continue
                if scheduled.mode == "step":
                    request.num_steps_done += 1
                if request_id in output.finished:
                    request.status = DiTRequestStatus.FINISHED
                    request.num_steps_done = request.num_steps
                    self.running.remove(request)
                    del self.requests[request_id]
                    self.cache.release(request_id)
                    finished.append((request, output.finished[request_id]))
        return finished
