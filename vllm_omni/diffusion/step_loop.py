# SPDX-License-Identifier: Apache-2.0
"""The step loop every step-wise family runs on: the framework's, not a family's.

A family brings its model code as a `DenoisingRunner`: it prepares new requests (noise, prompt
embeddings, a sampler of its own per request), predicts the noise of one step for a group of
requests (one transformer call, guidance applied), and decodes finished requests. Everything
around that is here, the same for every family:

- each request's state lives in one DiTCacheManager entry (allocated here, freed by the
  scheduler when the request finishes or is cancelled);
- the residual-cache policy of each request (the stage's `residual_cache`, the request's own
  `cache_threshold`) and the statistics of the family's caches;
- the sampler step that follows each prediction, and whether a request is done;
- `step` scheduling (one denoising step per group, then the decode of the finished) or `fifo`
  (a group's whole requests before the next group), with the timing the scheduler prices.

`StepwiseKind` is the executor kind of such a stage: a family's kind names the components the
stage does not load and builds its runner; the pipeline is loaded here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from vllm_omni.diffusion.cache_manager import DiTCacheEntry, DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig, resolve_device
from vllm_omni.diffusion.executor_kind import ExecutorKind, StageInfo
from vllm_omni.diffusion.pipeline_loader import stage_pipeline
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import (
    POLICY,
    FirstBlockCache,
    ResidualCacheConfig,
    RowGroup,
)
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.errors import FieldError


@dataclass
class RequestState:
    """What a runner prepares for one new request: its tensors (`latents`, the noise, among
    them), its own sampler with the timesteps set, and any other step state it keeps."""

    tensors: dict[str, torch.Tensor]
    sampler: Any
    state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "latents" not in self.tensors:
            raise ValueError("tensors: a request's state needs its 'latents'")


class DenoisingRunner(Protocol):
    """A family's model code for a step-wise stage (one per stage process)."""

    @property
    def info(self) -> StageInfo: ...

    @property
    def residual_caches(self) -> Sequence[FirstBlockCache]:
        """The caches of its cached forwards (one per transformer); empty: the family has no
        residual caching, and a request asking for it is refused."""
        ...

    def check_request(self, request: DiTRequest) -> None:
        """Raise FieldError for a request that would fail mid-step."""
        ...

    def estimate_bytes(self, request: DiTRequest) -> int:
        """The bytes of the state the request will hold (the scheduler's admission check)."""
        ...

    def prepare(self, requests: list[DiTRequest]) -> list[RequestState]:
        """New requests (any shapes) -> their initial state, in order."""
        ...

    def denoise(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list[Any]:
        """One step of a group (equal step keys; each request at its own step, `state["step"]`
        of its entry): the noise prediction per request, guidance applied, in the form its
        sampler steps with."""
        ...

    def decode(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list[Any]:
        """Finished requests of one group -> their results, in order."""
        ...


def row_groups(requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list[RowGroup]:
    """The rows of each request in a batch laid out request after request, each with its
    `params.rows` (the conditional row, then its guidance rows): the residual cache's view."""
    groups, start = [], 0
    for request, entry in zip(requests, entries):
        stop = start + request.params.rows
        groups.append(RowGroup(start, stop, entry, entry.state["step"], request.num_steps))
        start = stop
    return groups


def timestep(entry: DiTCacheEntry) -> torch.Tensor:
    """The timestep of a request's next step."""
    return entry.state["sampler"].timesteps[entry.state["step"]]


class StepwiseExecutor:
    """The StageExecutor of every step-wise family: `runner` is the family's model code."""

    def __init__(self, config: DiTConfig, cache: DiTCacheManager, runner: DenoisingRunner):
        self.config = config
        self.cache = cache
        self.runner = runner

    @property
    def info(self) -> StageInfo:
        return self.runner.info

    def policy(self, params: Any) -> ResidualCacheConfig | None:
        """A request's residual-cache policy: the stage's, with the request's own threshold."""
        threshold = params.cache_threshold
        if threshold is None:
            return self.config.residual_cache
        if threshold > 0 and not self.runner.residual_caches:
            raise FieldError("cache_threshold", "this stage's model has no residual caching")
        return (self.config.residual_cache or ResidualCacheConfig()).with_threshold(threshold)

    def check_request(self, request: DiTRequest) -> None:
        self.policy(request.params)
        self.runner.check_request(request)

    def estimate_bytes(self, request: DiTRequest) -> int:
        return self.runner.estimate_bytes(request)

    def stats(self) -> dict[str, int]:
        caches = self.runner.residual_caches
        if not caches:
            return {}
        # Row-steps through every block / served by the residual cache.
        return {
            "residual_computed_rows": sum(c.num_computed_rows for c in caches),
            "residual_cached_rows": sum(c.num_cached_rows for c in caches),
        }

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        if scheduled.new_request_ids:
            self.prepare([requests[rid] for rid in scheduled.new_request_ids])
        groups = [[requests[rid] for rid in group] for group in scheduled.groups]
        if scheduled.mode == "step":
            return DiTRunnerOutput(*execute_steps(self, groups))
        return DiTRunnerOutput(*execute_whole(self, groups))

    # ------------------------------------------------------------------ the loop's steps
    def prepare(self, requests: list[DiTRequest]) -> None:
        with torch.inference_mode():  # text and image encoders run here; no autograd state kept
            states = self.runner.prepare(requests)
        for request, prepared in zip(requests, states, strict=True):
            self.cache.allocate(
                request.request_id,
                prepared.tensors,
                sampler=prepared.sampler,
                step=0,
                **prepared.state,
                **{POLICY: self.policy(request.params)},
            )

    def denoise_step(self, requests: list[DiTRequest]) -> None:
        entries = [self.cache.get(r.request_id) for r in requests]
        with torch.inference_mode():
            predictions = self.runner.denoise(requests, entries)
            for entry, prediction in zip(entries, predictions, strict=True):
                advance(entry, prediction)

    def is_done(self, request: DiTRequest) -> bool:
        return self.cache.get(request.request_id).state["step"] >= request.num_steps

    def decode(self, requests: list[DiTRequest]) -> dict[str, object]:
        entries = [self.cache.get(r.request_id) for r in requests]
        with torch.inference_mode():
            results = self.runner.decode(requests, entries)
        return {r.request_id: result for r, result in zip(requests, results, strict=True)}


def advance(entry: DiTCacheEntry, prediction: Any) -> None:
    """A request's latents one step on: its own sampler steps them with `prediction`."""
    entry.tensors["latents"] = entry.state["sampler"].step(
        prediction, timestep(entry), entry.tensors["latents"], return_dict=False
    )[0]
    entry.state["step"] += 1


def execute_steps(
    loop: StepwiseExecutor, groups: list[list[DiTRequest]]
) -> tuple[dict[str, object], list[float], list[float]]:
    """The results of the requests that finished and, per group, the seconds of its denoising
    step and of its decode (apart: the scheduler prices steps and decodes separately)."""
    finished: dict[str, object] = {}
    seconds, decode_seconds = [], []
    for group in groups:
        start = time.perf_counter()
        loop.denoise_step(group)
        denoised = time.perf_counter()
        done = [r for r in group if loop.is_done(r)]
        if done:
            finished.update(loop.decode(done))
        seconds.append(denoised - start)
        decode_seconds.append(time.perf_counter() - denoised)
    return finished, seconds, decode_seconds


def execute_whole(
    loop: StepwiseExecutor, groups: list[list[DiTRequest]]
) -> tuple[dict[str, object], list[float]]:
    """Whole requests (the `fifo` scheduler): every step of a group, then its results, before
    the next group; the results and each group's seconds."""
    finished: dict[str, object] = {}
    seconds = []
    for group in groups:
        start = time.perf_counter()
        while not all(loop.is_done(r) for r in group):
            done, _, _ = execute_steps(loop, [[r for r in group if not loop.is_done(r)]])
            finished.update(done)
        seconds.append(time.perf_counter() - start)
    return finished, seconds


class StepwiseKind(ExecutorKind):
    """The executor kind of a step-wise stage. A family's kind (also an ImageKind, a VideoKind
    ...) sets `name`, `skip_components` and implements `runner`."""

    skip_components: ClassVar[tuple[str, ...]] = ()
    """Pipeline components the stage does not load (another stage runs them)."""

    def runner(self, pipe: Any, config: DiTConfig, device: torch.device) -> DenoisingRunner:
        """The family's model code over the loaded pipeline."""
        raise NotImplementedError

    def build(self, config: DiTConfig, cache: DiTCacheManager, pipe: Any = None):
        device = resolve_device(config.device)
        pipe = stage_pipeline(config, device, pipe, self.skip_components)
        return StepwiseExecutor(config, cache, self.runner(pipe, config, device))
