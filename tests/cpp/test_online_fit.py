# SPDX-License-Identifier: Apache-2.0
"""Online calibration: the CPP scheduler fits its cost model to the steps it runs.

Unit tests feed synthetic step times from a known "true" model (this machine's float32
calibration, docs/cpp.md) to `OnlineCostModel`. A real CPP engine fitting from an empty
calibration cache (the fit reaching the scheduler, /metrics and the cache):
tests/cpp/test_cpp_engine.py.
"""

import random
from types import SimpleNamespace

import pytest

from vllm_omni.cpp import online_fit
from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.online_fit import OnlineCalibration, OnlineCostModel

from .test_scheduler import make_scheduler, new_step

TRUE = CostModel(linear=148e-6, attention=229e-9, step_overhead=2.47e-3, unit="s", context=2.37e-6)
"""float32 calibration of the tiny 8-layer Llama at PP=2 on the AVX2 EPYC (docs/cpp.md)."""
NOISE = 0.05


def run_prefill(scheduler, num_tokens: int, rng: random.Random, online=None, request_id="r"):
    """Prefill one prompt through the scheduler's hook, step by step as vLLM would, feeding the
    true model's step time (with noise) to `online`; returns [(chunk, context)]."""
    request = SimpleNamespace(request_id=request_id, num_tokens=num_tokens, sampling_params=None)
    scheduler.requests[request_id] = request
    steps, done = [], 0
    while done < num_tokens:
        if online is not None:
            scheduler._follow_online_fit()
        new_step(scheduler)
        chunk = scheduler._reserve_prefill_lookahead(request, done, num_tokens - done)
        steps.append((chunk, done))
        if online is not None:
            seconds = TRUE.step_cost([(chunk, done)]) * rng.uniform(1 - NOISE, 1 + NOISE)
            online.online.observe([(chunk, done)], seconds)
        done += chunk
    del scheduler.requests[request_id]
    return steps


def makespan(steps, model: CostModel, pp_size: int = 2) -> float:
    """Pipelined prefill time: every step crosses p stages, the slowest step sets the pace."""
    costs = [model.step_cost([step]) for step in steps]
    return sum(costs) + (pp_size - 1) * max(costs)


def synthetic(n: int, rng: random.Random, outliers: int = 0):
    """`n` steps of one chunk each, (chunks, true seconds with noise); the first `outliers`
    took 3x as long (a GC pause, a noisy neighbour)."""
    samples = []
    for i in range(n):
        chunk = (rng.choice([64, 256, 512, 1024, 2048]), rng.randrange(0, 32768, 128))
        seconds = TRUE.step_cost([chunk]) * rng.uniform(1 - NOISE, 1 + NOISE)
        samples.append(((chunk,), seconds * (3.0 if i < outliers else 1.0)))
    return samples


def test_fit_recovers_the_model_and_drops_outliers():
    rng = random.Random(0)
    online = OnlineCostModel(CostModel(1.0, 1e-3), "analytic")
    for chunks, seconds in synthetic(online_fit.SKIP_FIRST_STEPS, rng):
        online.observe(chunks, seconds)
    assert online.new_steps == 0  # the first steps after start-up are left out
    for chunks, seconds in synthetic(200, rng, outliers=10):  # e.g. GC pauses: 3x as long
        online.observe(chunks, seconds)
    status = online.fit(*online.snapshot())
    assert status is not None and status.source == "online"
    assert status.outliers == 10 and status.num_steps == 190
    assert status.rel_rmse < NOISE
    for shape in [(64, 0), (1024, 8192), (256, 30000)]:
        assert status.model.step_cost([shape]) == pytest.approx(TRUE.step_cost([shape]), rel=0.05)


def test_no_fit_from_too_few_steps_or_a_shape_it_cannot_fit():
    rng = random.Random(1)
    online = OnlineCostModel(CostModel(1.0, 1e-3), "analytic")
    few = [(c, s) for c, s in synthetic(online_fit.MIN_FIT_STEPS - 1, rng)]
    assert online.fit([online_fit.StepSample(c, s) for c, s in few], []) is None
    # Step times unrelated to the work: no linear cost model fits them within MAX_ADOPT_RMSE.
    erratic = [online_fit.StepSample(c, rng.uniform(0.01, 1.0)) for c, _ in synthetic(64, rng)]
    assert online.fit(erratic, []) is None


def test_a_prior_in_seconds_is_adjusted_by_few_steps_and_outweighed_by_many():
    rng = random.Random(2)
    prior = CostModel(2 * TRUE.linear, 2 * TRUE.attention, TRUE.step_overhead, "s", TRUE.context)
    online = OnlineCostModel(prior, "cached")
    assert not online.exploring  # a model in seconds needs no exploration
    for chunks, seconds in synthetic(400, rng):
        online.observe(chunks, seconds)
    model = online.fit(*online.snapshot()).model
    assert model.step_cost([(1024, 8192)]) == pytest.approx(TRUE.step_cost([(1024, 8192)]), rel=0.1)


def test_a_prior_of_many_steps_is_not_swayed_by_a_few_slow_ones():
    # A new engine starts from a fit of 256 steps; its first prompt's steps run 30% slow.
    online = OnlineCostModel(TRUE, "cached", prior_steps=256)
    rng = random.Random(5)
    for chunks, seconds in synthetic(online_fit.SKIP_FIRST_STEPS + 16, rng):
        online.observe(chunks, 1.3 * seconds)
    model = online.fit(*online.snapshot()).model
    shape = [(1024, 8192)]
    assert model.step_cost(shape) == pytest.approx(TRUE.step_cost(shape), rel=0.1)


@pytest.mark.parametrize("prompt_len", [16384, 32768])
def test_one_long_prompt_teaches_the_plan_of_the_offline_calibration(prompt_len):
    """Item 2 of issue 14, as a mechanism: an engine that starts with the analytic model and
    sees one 16K prompt plans the next prompts within 2% of the plan of the true model."""
    rng = random.Random(3)
    scheduler = make_scheduler()  # the analytic model
    scheduler.chunk_align = 128
    calibration = OnlineCalibration(OnlineCostModel(scheduler.cost_model, "analytic"), None, None)
    scheduler.online, scheduler._dither = calibration, 1.0
    try:
        first = run_prefill(scheduler, 16384, rng, online=calibration)
        status = calibration.online.fit(*calibration.online.snapshot())
        assert status is not None, "one long prompt did not give a fit"
        calibration.online.adopt(status)
        assert status.rel_rmse < 0.1
    finally:
        calibration.close()
    assert len({round(c / 128) for c, _ in first}) > 3  # exploration: chunk sizes vary

    def plan(model: CostModel):
        planner = make_scheduler()
        planner.chunk_align, planner.cost_model = 128, model
        return run_prefill(planner, prompt_len, rng)

    learned, offline = plan(status.model), plan(TRUE)
    ratio = makespan(learned, TRUE) / makespan(offline, TRUE)
    assert ratio <= 1.02, (len(learned), len(offline), ratio)
