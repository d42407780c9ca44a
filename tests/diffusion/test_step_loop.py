# SPDX-License-Identifier: Apache-2.0
"""The framework's step loop around a made-up runner (no pipeline): it keeps each request's state,
steps its sampler, decodes the finished, runs whole requests under `fifo`, and decides and counts
residual caching, for any family's runner."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.executor_kind import StageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import POLICY, FirstBlockCache, ResidualCacheConfig
from vllm_omni.diffusion.scheduler import DiTSchedulerOutput
from vllm_omni.diffusion.step_loop import RequestState, StepwiseExecutor, row_groups
from vllm_omni.errors import FieldError


@dataclass
class CountingSampler:
    """Latents go down by the prediction at each of `steps` timesteps."""

    steps: int

    @property
    def timesteps(self) -> torch.Tensor:
        return torch.arange(self.steps, 0, -1)

    def step(self, prediction, t, latents, return_dict=False):
        return (latents - prediction,)


class FakeRunner:
    """Each request's latents start at its seed; a step predicts 1 per row it runs."""

    info = StageInfo()

    def __init__(self, caches: int = 0) -> None:
        self.residual_caches = [FirstBlockCache() for _ in range(caches)]
        self.groups: list[list[tuple[int, int]]] = []

    def check_request(self, request: DiTRequest) -> None:
        pass

    def estimate_bytes(self, request: DiTRequest) -> int:
        return 4

    def prepare(self, requests):
        return [
            RequestState({"latents": torch.tensor(float(r.params.seed))}, CountingSampler(
                r.params.num_inference_steps
            ))
            for r in requests
        ]  # fmt: skip

    def denoise(self, requests, entries):
        self.groups.append([(g.start, g.stop) for g in row_groups(requests, entries)])
        return [torch.tensor(float(r.params.rows)) for r in requests]

    def decode(self, requests, entries):
        return [float(e.tensors["latents"]) for e in entries]


def params(steps: int, seed: int, **kw) -> DiffusionSamplingParams:
    return DiffusionSamplingParams(num_inference_steps=steps, seed=seed, height=8, width=8, **kw)


def run(loop: StepwiseExecutor, mode: str, requests: dict[str, DiTRequest]) -> list[dict]:
    """Engine steps until every request finished: what finished at each."""
    done, new, outputs = set(), list(requests), []
    while len(done) < len(requests):
        group = [rid for rid in requests if rid not in done]
        out = loop.execute_model(DiTSchedulerOutput(mode, new, [group]), requests)
        new = []
        for rid in out.finished:
            done.add(rid)
            loop.cache.release(rid)
        outputs.append(out.finished)
    return outputs


def test_step_mode_advances_every_request_one_step_and_decodes_the_finished():
    loop = StepwiseExecutor(DiTConfig(model="m"), DiTCacheManager(), FakeRunner())
    requests = {
        "a": DiTRequest("a", params(2, seed=10), {}),
        "b": DiTRequest("b", params(3, seed=20, negative_prompt="x", true_cfg_scale=4.0), {}),
    }
    outputs = run(loop, "step", requests)
    assert outputs == [{}, {"a": 8.0}, {"b": 14.0}]  # a: 10 - 2 x 1 row; b: 20 - 3 x 2 rows
    # Rows laid out request after request, guidance rows beside their request's.
    assert loop.runner.groups[0] == [(0, 1), (1, 3)] and loop.runner.groups[2] == [(0, 2)]
    assert loop.cache.num_entries == 0


def test_fifo_runs_a_group_to_its_end_in_one_engine_step():
    loop = StepwiseExecutor(DiTConfig(model="m"), DiTCacheManager(), FakeRunner())
    requests = {
        "a": DiTRequest("a", params(2, seed=10), {}),
        "b": DiTRequest("b", params(4, 5), {}),
    }
    assert run(loop, "fifo", requests) == [{"a": 8.0, "b": 1.0}]


def test_the_loop_decides_each_requests_residual_cache_policy():
    stage = ResidualCacheConfig(threshold=0.2)
    loop = StepwiseExecutor(
        DiTConfig(model="m", residual_cache=stage), DiTCacheManager(), FakeRunner(1)
    )
    requests = [
        DiTRequest("stage", params(2, 1), {}),
        DiTRequest("own", params(2, 2, cache_threshold=0.5), {}),
        DiTRequest("off", params(2, 3, cache_threshold=0.0), {}),
    ]
    loop.prepare(requests)
    policies = [loop.cache.get(r.request_id).state[POLICY] for r in requests]
    assert [p.threshold for p in policies] == [0.2, 0.5, 0.0]
    loop.runner.residual_caches[0].num_cached_rows = 3
    assert loop.stats() == {"residual_computed_rows": 0, "residual_cached_rows": 3}


def test_a_runner_without_residual_caching_refuses_a_threshold():
    loop = StepwiseExecutor(DiTConfig(model="m"), DiTCacheManager(), FakeRunner())
    with pytest.raises(FieldError, match="no residual caching") as e:
        loop.check_request(DiTRequest("r", params(2, 1, cache_threshold=0.3), {}))
    assert e.value.field == "cache_threshold"
    loop.check_request(DiTRequest("r", params(2, 1, cache_threshold=0.0), {}))  # off: fine
    assert loop.stats() == {}
