# SPDX-License-Identifier: Apache-2.0
"""Worker side of CPP (the worker hook `cpp`): a per-rank busy timeline of model steps.

Every forward pass of the model runner is timed on the worker (`time.monotonic`, comparable across
processes on one host) together with the chunks it ran, as (new tokens, cached tokens) per
request. The timeline feeds cost-model calibration (`vllm_omni.cpp.calibrate`) and the bubble
measurements of `benchmarks/cpp_ttft.py`; callers fetch it with
`llm.collective_rpc("cpp_take_step_records")`.

With `cpp.micro_chunks` > 1 the worker also carries out the RFC's phase 2: it splits a step that
holds one long prefill chunk into micro-chunks (`vllm_omni.cpp.micro_chunks`) and runs them one by
one, each forward sending its activations on, so the pieces stream through the PP ranks within the
step; every piece gets its own record.

The last PP rank also hands its records to the scheduler, for online calibration
(`vllm_omni.cpp.online_fit`): as the attribute `STEP_TIMES_ATTR` of the ModelRunnerOutput it
returns, (chunks, seconds) per forward since its previous output. vLLM sends that output to the
engine core whole (pickled by the multiprocessing executor, as is in-process), so the attribute
arrives with it; `tests/cpp/test_cpp_engine.py` checks this end to end.

Only the runner's forward is timed, not the receive of the previous stage's activations, so the
records are busy time. On CPU the PP receive completes before the runner starts; on CUDA the
receive is waited lazily inside the runner, so records there include some waiting (not exercised
on a GPU yet).
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.parallel_state import get_pp_group
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

from vllm_omni.cpp import micro_chunks
from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.cost_model_source import resolve_cost_model

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

MAX_RECORDS = 100_000
STEP_TIMES_ATTR = "cpp_step_times"
"""Attribute of the last rank's ModelRunnerOutput: [(chunks, busy seconds)] per forward pass."""


@dataclass(frozen=True)
class StepRecord:
    rank: int
    start_s: float
    end_s: float
    chunks: tuple[tuple[int, int], ...]
    """(num_new_tokens, num_cached_tokens) of each scheduled request."""
    piece: int = 0
    pieces: int = 1
    """This forward is micro-chunk `piece` of `pieces` of one scheduler step (cpp.micro_chunks)."""

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


class CPPStepHook:
    """The worker hook `cpp` (vllm_omni.worker.hooks): records a StepRecord for every
    model-runner forward pass of its worker, and with `cpp.micro_chunks` > 1 splits a lone
    prefill chunk into micro-chunks (`micro_chunks`). Named first, so that the hooks after it
    see each micro-chunk as a step of its own."""

    def __init__(self, worker) -> None:
        self.worker = worker

    def install(self) -> None:
        self._step_records: deque[StepRecord] = deque(maxlen=MAX_RECORDS)
        worker = self.worker
        runner = worker.model_runner
        forward = runner.execute_model

        def timed_forward(scheduler_output, *args, **kwargs):
            start = time.monotonic()
            try:
                return forward(scheduler_output, *args, **kwargs)
            finally:
                if scheduler_output.total_num_scheduled_tokens > 0:
                    record = StepRecord(
                        worker.rank,
                        start,
                        time.monotonic(),
                        scheduled_chunks(scheduler_output),
                        *self._piece,
                    )
                    self._step_records.append(record)
                    if self._unreported is not None:
                        self._unreported.append((record.chunks, record.seconds))

        # An instance attribute on our own worker's runner: the runner class stays untouched.
        runner.execute_model = timed_forward
        self._unreported: list | None = [] if get_pp_group().is_last_rank else None
        self._micro = None
        self._piece = (0, 1)
        config = CPPConfig.from_additional_config(worker.vllm_config.additional_config)
        if config is not None and config.micro_chunks > 1:
            cost_model = resolve_cost_model(config, worker.vllm_config)
            align = config.chunk_align or worker.vllm_config.cache_config.block_size
            self._micro = (cost_model, config.micro_chunks, align)

    def _report_step_times(self, output: Any) -> Any:
        """Attach the forwards' timings since the last output to this output (last rank)."""
        if not self._unreported or not isinstance(output, ModelRunnerOutput):
            return output
        if output is EMPTY_MODEL_RUNNER_OUTPUT:  # a shared constant: never mutate it
            output = copy.copy(output)
        setattr(output, STEP_TIMES_ATTR, self._unreported)
        self._unreported = []
        return output

    def sample_tokens(self, grammar_output, call_next):
        return self._report_step_times(call_next(grammar_output))

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput, call_next):
        return self._report_step_times(self._execute_pieces(scheduler_output, call_next))

    def _execute_pieces(self, scheduler_output: SchedulerOutput, call_next):
        pieces = self._micro_pieces(scheduler_output) if self._micro else None
        if pieces is None:
            return call_next(scheduler_output)
        try:
            for i, piece in enumerate(pieces[:-1]):
                self._piece = (i, len(pieces))
                # The last rank defers sampling to sample_tokens(); a piece that ends mid-prompt
                # samples nothing the scheduler keeps, so its output is dropped here.
                if call_next(piece) is None and get_pp_group().is_last_rank:
                    self.worker.model_runner.sample_tokens(None)
            self._piece = (len(pieces) - 1, len(pieces))
            return call_next(pieces[-1])
        finally:
            self._piece = (0, 1)

    def _micro_pieces(self, scheduler_output: SchedulerOutput) -> list | None:
        found = micro_chunks.lone_prefill(scheduler_output, self.worker.model_runner.requests)
        if found is None:
            return None
        req_id, cached, num_tokens = found
        cost_model, pieces, align = self._micro
        if num_tokens < 2 * align:
            return None
        sizes = micro_chunks.piece_sizes(cost_model, cached, num_tokens, pieces, align)
        if len(sizes) < 2:
            return None
        return micro_chunks.split(scheduler_output, req_id, cached, sizes)

    def take_records(self) -> list[dict[str, Any]]:
        """Drain the step records (as dicts, to cross the RPC boundary)."""
        records = [asdict(r) for r in self._step_records]
        self._step_records.clear()
        return records
