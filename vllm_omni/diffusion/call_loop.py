# SPDX-License-Identifier: Apache-2.0
"""The step loop for a pipeline that runs its own `__call__`: step-level batching with no model
code.

Each request runs the pipeline's `__call__` (vllm_omni.diffusion.request_call), paused at its
denoiser calls and its VAE decode. A step of a group runs the denoiser calls its requests are
paused at, batched where their arguments line up (vllm_omni.diffusion.batched_calls), round
after round until each request has made one step (a pipeline that calls the denoiser twice a
step - true CFG, two experts - makes two rounds); a request paused at its VAE decode has
finished denoising, and the decodes of a group's finished requests run batched too. Requests
join at the next step with whatever prompt, seed, step count or guidance, and leave when done.

Everything else is the framework's as for a family's runner (vllm_omni.diffusion.step_loop):
the request's state lives in its DiT cache entry (releasing it unwinds the request's thread),
`step` or `fifo` scheduling, the timings the scheduler prices. A family brings `PipelineCalls`:
what to pass the pipeline for a request and what to make of what it returns.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

import torch

from vllm_omni.diffusion.batched_calls import run_batched
from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.executor_kind import StageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.request_call import Paused, RequestCall
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.diffusion.step_loop import execute_steps, execute_whole
from vllm_omni.errors import FieldError

CALL = "call"
"""A request's RequestCall in its cache entry's state."""


class PipelineCalls(Protocol):
    """A family's side of a pipeline run by its own `__call__`."""

    @property
    def info(self) -> StageInfo: ...

    @property
    def pipe(self) -> Any:
        """The loaded pipeline (its models shared by every request's run)."""
        ...

    @property
    def denoiser(self) -> str:
        """The pipeline component whose calls are batched (`transformer`, `unet`)."""
        ...

    @property
    def counts_steps(self) -> bool:
        """Whether the pipeline's `__call__` takes `callback_on_step_end` (steps are told
        apart by it; without it, each round of denoiser calls is a step)."""
        ...

    def check_request(self, request: DiTRequest) -> None: ...

    def estimate_bytes(self, request: DiTRequest) -> int: ...

    def call_kwargs(self, request: DiTRequest) -> dict[str, Any]:
        """The pipeline's `__call__` arguments for one request."""
        ...

    def result(self, request: DiTRequest, output: Any) -> Any:
        """What the stage returns for a request, from what its `__call__` returned."""
        ...


class CallLoopExecutor:
    """The StageExecutor of a pipeline run by its own `__call__`, one paused run per request."""

    def __init__(self, config: DiTConfig, cache: DiTCacheManager, calls: PipelineCalls) -> None:
        self.config = config
        self.cache = cache
        self.calls = calls
        self._ids = itertools.count()
        self._failed: dict[str, BaseException] = {}

    @property
    def info(self) -> StageInfo:
        return self.calls.info

    def check_request(self, request: DiTRequest) -> None:
        if request.params.cache_threshold:
            raise FieldError(
                "cache_threshold", "a pipeline run by its own call has no residual caching"
            )
        self.calls.check_request(request)

    def estimate_bytes(self, request: DiTRequest) -> int:
        return self.calls.estimate_bytes(request)

    def stats(self) -> dict[str, int]:
        return {}

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        self._failed = {}
        if scheduled.new_request_ids:
            self.prepare([requests[rid] for rid in scheduled.new_request_ids])
        groups = [
            [requests[rid] for rid in group if rid not in self._failed]
            for group in scheduled.groups
        ]
        if scheduled.mode == "step":
            out = DiTRunnerOutput(*execute_steps(self, groups))
        else:
            out = DiTRunnerOutput(*execute_whole(self, groups))
        out.failed.update(self._failed)
        return out

    # ------------------------------------------------------------------ the loop's steps
    def prepare(self, requests: list[DiTRequest]) -> None:
        """Each request's run up to its first denoiser call (its encoders run here)."""
        for request in requests:
            run = RequestCall(
                self.calls.pipe,
                self.calls.denoiser,
                self.calls.call_kwargs(request),
                name=f"request-{next(self._ids)}",
                counts_steps=self.calls.counts_steps,
            )
            self.cache.allocate(request.request_id, {}, on_release=run.cancel, **{CALL: run})
            run.start()
            self._check(request, run)

    def _run(self, request: DiTRequest) -> RequestCall:
        return self.cache.get(request.request_id).state[CALL]

    def _check(self, request: DiTRequest, run: RequestCall) -> None:
        if run.paused is Paused.FAILED:
            self._failed[request.request_id] = run.error

    def denoise_step(self, requests: list[DiTRequest]) -> None:
        """One step of each request: rounds of batched denoiser calls until each has made it
        (or, for a pipeline that does not count steps, one round)."""
        runs = [self._run(r) for r in requests]
        steps = [run.steps for run in runs]
        denoiser = getattr(self.calls.pipe, self.calls.denoiser)
        while True:
            due = [
                (request, run)
                for request, run, step in zip(requests, runs, steps)
                if run.paused is Paused.CALL and (run.steps == step or not self.calls.counts_steps)
            ]
            if not due:
                return
            with torch.inference_mode():
                outputs = run_batched(denoiser, [run.call for _, run in due])
            for (request, run), output in zip(due, outputs):
                run.resume(output)
                self._check(request, run)
            if not self.calls.counts_steps:
                return

    def is_done(self, request: DiTRequest) -> bool:
        if request.request_id in self._failed:
            return True
        return self._run(request).paused in (Paused.DECODE, Paused.DONE)

    def decode(self, requests: list[DiTRequest]) -> dict[str, object]:
        """The VAE decodes of requests done denoising, batched; then each run returns (a
        pipeline that decodes otherwise has returned already)."""
        live = [(r, self._run(r)) for r in requests if r.request_id not in self._failed]
        decoding = [(r, run) for r, run in live if run.paused is Paused.DECODE]
        with torch.inference_mode():
            outputs = run_batched(self.calls.pipe.vae.decode, [run.call for _, run in decoding])
        for (request, run), output in zip(decoding, outputs):
            run.resume(output)
            self._check(request, run)
        results = {}
        for request, run in live:
            if run.paused is Paused.DONE:
                results[request.request_id] = self.calls.result(request, run.result)
            elif run.paused is not Paused.FAILED:  # a second decode: not one this loop runs
                self._failed[request.request_id] = RuntimeError(
                    f"{type(self.calls.pipe).__name__} made more model calls after its VAE decode"
                )
        return results
