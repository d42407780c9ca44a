# SPDX-License-Identifier: Apache-2.0
"""Worker side of CPP: a per-rank busy timeline of model steps.

Every forward pass of the model runner is timed on the worker (`time.monotonic`, comparable across
processes on one host) together with the chunks it ran, as (new tokens, cached tokens) per
request. The timeline feeds cost-model calibration (`vllm_omni.cpp.calibrate`) and the bubble
measurements of `benchmarks/cpp_ttft.py`; callers fetch it with
`llm.collective_rpc("cpp_take_step_records")`.

Only the runner's forward is timed, not the receive of the previous stage's activations, so the
records are busy time. On CPU the PP receive completes before the runner starts; on CUDA the
receive is waited lazily inside the runner, so records there include some waiting (not exercised
on a GPU yet).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

MAX_RECORDS = 100_000


@dataclass(frozen=True)
class StepRecord:
    rank: int
    start_s: float
    end_s: float
    chunks: tuple[tuple[int, int], ...]
    """(num_new_tokens, num_cached_tokens) of each scheduled request."""

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


def scheduled_chunks(scheduler_output: SchedulerOutput) -> tuple[tuple[int, int], ...]:
    """(new tokens, cached tokens before this step) of every request in a scheduler output."""
    chunks = []
    for req in scheduler_output.scheduled_new_reqs:
        chunks.append((scheduler_output.num_scheduled_tokens[req.req_id], req.num_computed_tokens))
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens):
        chunks.append((scheduler_output.num_scheduled_tokens[req_id], num_computed))
    return tuple(chunks)


class CPPWorkerMixin:
    """Records a StepRecord for every model-runner forward pass of this worker."""

    def _install_step_timer(self) -> None:
        self._step_records: deque[StepRecord] = deque(maxlen=MAX_RECORDS)
        runner = self.model_runner
        forward = runner.execute_model

        def timed_forward(scheduler_output, *args, **kwargs):
            start = time.monotonic()
            try:
                return forward(scheduler_output, *args, **kwargs)
            finally:
                if scheduler_output.total_num_scheduled_tokens > 0:
                    self._step_records.append(
                        StepRecord(
                            self.rank, start, time.monotonic(), scheduled_chunks(scheduler_output)
                        )
                    )

        # An instance attribute on our own worker's runner: the runner class stays untouched.
        runner.execute_model = timed_forward

    def cpp_take_step_records(self) -> list[dict[str, Any]]:
        """Drain this worker's step records (as dicts, to cross the RPC boundary)."""
        records = [asdict(r) for r in self._step_records]
        self._step_records.clear()
        return records


class CPPCPUWorker(CPPWorkerMixin, CPUWorker):
    def init_device(self) -> None:
        super().init_device()
        self._install_step_timer()


class CPPGPUWorker(CPPWorkerMixin, Worker):
    def init_device(self) -> None:
        super().init_device()
        self._install_step_timer()


def worker_cls_for_platform() -> str:
    """The qualified name vLLM's `worker_cls` needs (it crosses process boundaries as a string)."""
    from vllm.platforms import current_platform

    cls = CPPCPUWorker if current_platform.is_cpu() else CPPGPUWorker
    return f"{cls.__module__}.{cls.__qualname__}"
