# SPDX-License-Identifier: Apache-2.0
"""First-block residual caching in the Wan stage (in process, no engine): the cached forward
with every row computing is the transformer's own forward; a threshold no step meets gives the
plain frames; the loosest threshold serves rows from the cache, per request, and a Wan2.2 request
never reuses the other expert's residuals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import ResidualCacheConfig, RowGroup
from vllm_omni.diffusion.step_loop import StepwiseExecutor
from vllm_omni.diffusion.video_params import VideoSamplingParams
from vllm_omni.models.wan.cached_forward import WanCachedForward
from vllm_omni.models.wan.runner import WanRunner


def load(folder):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, thresholds: list[float | None], stage: ResidualCacheConfig | None = None):
    """Videos of requests in flight together (one per threshold) and the runner."""
    config = DiTConfig(model="unused", residual_cache=stage)
    runner = WanRunner(pipe, config, torch.device("cpu"))
    loop = StepwiseExecutor(config, DiTCacheManager(), runner)
    requests = [
        DiTRequest(
            f"r{i}",
            VideoSamplingParams(
                height=32,
                width=32,
                num_frames=5,
                num_inference_steps=12,
                seed=i,
                cache_threshold=threshold,
            ),
            {"prompt": f"a red cat {i}"},
        )  # fmt: skip
        for i, threshold in enumerate(thresholds)
    ]
    loop.prepare(requests)
    for _ in range(12):
        loop.denoise_step(requests)
    videos = loop.decode(requests)
    return [videos[r.request_id]["video"] for r in requests], runner


@pytest.fixture(scope="module")
def pipe(tiny_models):
    return load(tiny_models["wan2.1-t2v"])


def test_cached_forward_with_every_row_computing_is_the_plain_forward(pipe) -> None:
    transformer = pipe.transformer
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(3, 16, 2, 4, 4, generator=gen)
    timestep = torch.tensor([999.0, 500.0, 20.0])
    text = torch.randn(3, 512, transformer.config.text_dim, generator=gen)
    with torch.inference_mode():
        expected = transformer(latents, timestep, text, return_dict=False)[0]
        groups = [RowGroup(i, i + 1, _entry(), 0, 10) for i in range(3)]
        got = WanCachedForward(transformer)(latents, timestep, text, None, groups)
    assert torch.equal(got, expected)


def _entry():
    cache = DiTCacheManager()
    return cache.allocate(str(id(cache)), {})


def test_a_threshold_no_step_meets_gives_the_plain_frames(pipe) -> None:
    plain, _ = run(pipe, [None, None])
    never, runner = run(pipe, [1e-9, 1e-9], ResidualCacheConfig(warmup_steps=1))
    for a, b in zip(plain, never):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
    forward = runner.cached_forwards[0].cache
    assert forward.num_cached_rows == 0 and forward.num_computed_rows > 0


def test_the_loosest_threshold_serves_rows_per_request(pipe) -> None:
    videos, runner = run(pipe, [1.0, 0.0])
    forward = runner.cached_forwards[0].cache
    assert forward.num_cached_rows > 0  # the first request's rows
    plain, _ = run(pipe, [None, None])
    assert np.abs(videos[1].astype(int) - plain[1].astype(int)).max() <= 1  # the other's: not
    assert not np.array_equal(videos[0], plain[0])


def test_an_expert_switch_computes(tiny_models, monkeypatch) -> None:
    from vllm_omni.models.wan import runner as wan_runner

    forgotten = []
    monkeypatch.setattr(wan_runner, "forget", lambda entry: forgotten.append(entry.state["step"]))
    pipe = load(tiny_models["wan2.2-t2v"])
    _, runner = run(pipe, [1.0], ResidualCacheConfig(threshold=1.0, warmup_steps=0))
    sampler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    sampler.set_timesteps(12)
    switch = [runner.expert(t) for t in sampler.timesteps].index(1)
    assert forgotten == [switch]  # the low-noise expert's first step starts afresh
    high, low = (f.cache for f in runner.cached_forwards)
    assert high.num_computed_rows >= 2 and low.num_computed_rows >= 2  # the first of each
    assert high.num_cached_rows + low.num_cached_rows > 0
