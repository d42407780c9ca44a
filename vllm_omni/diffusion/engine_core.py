# SPDX-License-Identifier: Apache-2.0
"""DiffusionEngineCore: the DiT stage's busy loop, in its own process.

The loop has the shape of vLLM's EngineCore.step - schedule, execute, update - with the
DiffusionScheduler, a family's StageExecutor (vllm_omni.diffusion.executor_kind) and the
DiTCacheManager in place of vLLM's. Why not
vLLM's EngineCore itself: see docs/architecture.md ("Why the DiT stage has its own loop").

Messages in (`inbox`): ("add", request_id, (inputs, params)) (inputs: numpy arrays and text),
("abort", request_id, None), ("stats", token, None), ("shutdown", None, None). Messages out
(`outbox`): ("ready", None, info), ("error", None, traceback), ("done", request_id, result),
("failed", request_id, the exception), ("step", None, (start, end, num_requests, progress)) with
progress {request_id: (steps done, steps in all)} of the requests the step ran, ("stats", token,
stats).
"""

from __future__ import annotations

import queue
import time
import traceback
from typing import Any

import numpy as np
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheConfig, DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.deadline import DeadlineUnreachable
from vllm_omni.diffusion.executor_kind import StageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiffusionScheduler, DiTSchedulerConfig
from vllm_omni.logger import init_logger
from vllm_omni.registry import executor_kind

logger = init_logger(__name__)

EXPIRY_CHECK_S = 10.0


class DiffusionEngineCore:
    """`executor`: a registered executor name (a stage's `executor:`). `pipe`: an already built
    pipeline instead of `config.model`, for executors that take one."""

    def __init__(self, config: DiTConfig, mode: str, executor: str, pipe=None) -> None:
        self.config = config
        self.cache = DiTCacheManager(DiTCacheConfig(config.cache_max_bytes, config.cache_ttl_s))
        self.executor = executor_kind(executor).build(config, self.cache, pipe)
        self.scheduler = DiffusionScheduler(
            DiTSchedulerConfig(
                mode=mode,
                max_num_seqs=config.max_num_seqs,
                policy=config.scheduling_policy,
                admission_control=config.admission_control,
            ),
            self.cache,
            self.executor.estimate_bytes,
        )
        self.num_steps = 0
        self.num_finished = 0
        self.last_step_s = 0.0
        self.last_progress: dict[str, tuple[int, int]] = {}
        """The last step's requests: request id -> (steps done, steps in all)."""
        self.last_failed: dict[str, BaseException] = {}
        """The requests that failed alone in the last step (aborted), and why."""

    @property
    def info(self) -> StageInfo:
        return self.executor.info

    def add_request(self, request_id: str, inputs: dict[str, torch.Tensor], params: Any) -> None:
        request = DiTRequest(request_id, params, inputs)
        self.executor.check_request(request)  # a bad request fails alone, not a whole step later
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> bool:
        return self.scheduler.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> tuple[list[tuple[DiTRequest, object]], float, float]:
        scheduled = self.scheduler.schedule()
        start = time.monotonic()
        self.last_progress, self.last_failed = {}, {}
        if scheduled.is_empty:
            return [], start, start
        requests = self.scheduler.requests
        output = self.executor.execute_model(scheduled, requests)
        for request_id, error in output.failed.items():
            self.scheduler.abort_request(request_id)
            self.last_failed[request_id] = error
        ran = [requests[rid] for group in scheduled.groups for rid in group if rid in requests]
        finished = self.scheduler.update_from_output(scheduled, output)
        end = time.monotonic()
        self.num_steps += 1
        self.num_finished += len(finished)
        self.last_step_s = end - start
        self.last_progress = {r.request_id: (r.num_steps_done, r.num_steps) for r in ran}
        return finished, start, end

    def stats(self) -> dict[str, Any]:
        stats = {
            "num_waiting": self.scheduler.num_waiting,
            "num_running": self.scheduler.num_running,
            "cache_entries": self.cache.num_entries,
            "cache_bytes": self.cache.num_bytes,
            "num_steps": self.num_steps,
            "num_finished": self.num_finished,
            "last_step_s": self.last_step_s,
            **self.scheduler.slo.as_dict(),
            **self.executor.stats(),
        }
        return stats


def run_dit_stage(config: DiTConfig, mode: str, executor: str, inbox, outbox) -> None:
    """Process entry point of a DiT stage."""
    try:
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        core = DiffusionEngineCore(config, mode, executor)
    except Exception:
        outbox.put(("error", None, traceback.format_exc()))
        return
    outbox.put(("ready", None, core.info))
    last_expiry_check = time.monotonic()
    while True:
        try:
            message = inbox.get(block=not core.has_unfinished_requests())
        except queue.Empty:
            message = None
        while message is not None:
            if not _handle(core, message, outbox):
                return
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                message = None
        if core.has_unfinished_requests():
            _step(core, outbox)
        if time.monotonic() - last_expiry_check > EXPIRY_CHECK_S:
            last_expiry_check = time.monotonic()
            core.cache.clear_expired()


def _handle(core: DiffusionEngineCore, message: tuple, outbox) -> bool:
    kind, key, payload = message
    if kind == "add":
        arrays, params = payload
        # Arrays become tensors; text and input images (a list of arrays) stay as sent.
        inputs = {
            name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            for name, value in arrays.items()
        }
        try:
            core.add_request(key, inputs, params)
        except (ValueError, DeadlineUnreachable) as e:
            outbox.put(("failed", key, e))  # a FieldError keeps its field
    elif kind == "abort":
        core.abort_request(key)
    elif kind == "stats":
        outbox.put(("stats", key, core.stats()))
    elif kind == "shutdown":
        return False
    return True


def _step(core: DiffusionEngineCore, outbox) -> None:
    try:
        finished, start, end = core.step()
    except Exception as e:  # fail the requests in flight, keep the stage up
        logger.exception("DiT step failed")
        message = f"DiT stage failed: {type(e).__name__}: {e}"
        for request_id in [r.request_id for r in core.scheduler.running]:
            core.abort_request(request_id)
            outbox.put(("failed", request_id, RuntimeError(message)))
        return
    running = core.scheduler.num_running + len(finished)
    outbox.put(("step", None, (start, end, running, core.last_progress)))
    for request_id, error in core.last_failed.items():
        message = f"{type(error).__name__}: {error}"
        outbox.put(
            (
                "failed",
                request_id,
                error if isinstance(error, ValueError) else RuntimeError(message),
            )
        )
    for request, result in finished:
        if torch.is_tensor(result):
            result = result.numpy()  # latents, waveforms; images are uint8 arrays already
        outbox.put(("done", request.request_id, result))
