# SPDX-License-Identifier: Apache-2.0
"""One engine step of a step-wise denoising runner: a denoising step per group of requests,
then the decode of those that finished. Runners of any family implement `StepRunner`."""

from __future__ import annotations

import time
from typing import Any, Protocol

from vllm_omni.diffusion.cache_manager import DiTCacheEntry
from vllm_omni.diffusion.request import DiTRequest


class StepRunner(Protocol):
    def denoise_step(self, requests: list[DiTRequest]) -> None:
        """One denoising step for each request (one group: equal step keys)."""
        ...

    def is_done(self, request: DiTRequest) -> bool: ...

    def decode(self, requests: list[DiTRequest]) -> dict[str, object]:
        """Finished requests of one group -> their results."""
        ...


def execute_steps(
    runner: StepRunner, groups: list[list[DiTRequest]]
) -> tuple[dict[str, object], list[float], list[float]]:
    """The results of the requests that finished and, per group, the seconds of its denoising
    step and of its decode (apart: the scheduler prices steps and decodes separately)."""
    finished: dict[str, object] = {}
    seconds, decode_seconds = [], []
    for group in groups:
        start = time.perf_counter()
        runner.denoise_step(group)
        denoised = time.perf_counter()
        done = [r for r in group if runner.is_done(r)]
        if done:
            finished.update(runner.decode(done))
        seconds.append(denoised - start)
        decode_seconds.append(time.perf_counter() - denoised)
    return finished, seconds, decode_seconds


def advance(entry: DiTCacheEntry, prediction: Any) -> None:
    """A request's latents one step on: its own sampler (`state["sampler"]`, at
    `state["step"]`) steps them with the transformer's `prediction`."""
    sampler = entry.state["sampler"]
    t = sampler.timesteps[entry.state["step"]]
    entry.tensors["latents"] = sampler.step(
        prediction, t, entry.tensors["latents"], return_dict=False
    )[0]
    entry.state["step"] += 1


def execute_whole(
    runner: StepRunner, groups: list[list[DiTRequest]]
) -> tuple[dict[str, object], list[float]]:
    """Whole requests (the `fifo` scheduler): every step of a group, then its results, before
    the next group; the results and each group's seconds."""
    finished: dict[str, object] = {}
    seconds = []
    for group in groups:
        start = time.perf_counter()
        while not all(runner.is_done(r) for r in group):
            done, _, _ = execute_steps(runner, [[r for r in group if not runner.is_done(r)]])
            finished.update(done)
        seconds.append(time.perf_counter() - start)
    return finished, seconds
