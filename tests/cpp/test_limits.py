# SPDX-License-Identifier: Apache-2.0
import itertools

import pytest

from vllm_omni.cpp import limits
from vllm_omni.cpp.chunking import budget_for_steps, plan_chunks
from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.simulator import closed_form_makespan, fixed_chunks, simulate, stage_times

# Shaped like the calibration of the tiny 8-layer Llama on the 2-core CPU (per stage, PP=2).
CPU_LIKE = CostModel(
    linear=2.26e-5, attention=1.02e-8, step_overhead=1.9e-3, unit="s", context=5.9e-7
)


def compositions(cells: int):
    """Every way to cut `cells` grid cells into consecutive chunks."""
    for cuts in itertools.product((False, True), repeat=cells - 1):
        sizes, run = [], 1
        for cut in cuts:
            if cut:
                sizes.append(run)
                run = 1
            else:
                run += 1
        yield sizes + [run]


@pytest.mark.parametrize("pp_size", [2, 3])
def test_best_plan_matches_brute_force(pp_size):
    model = CostModel(linear=1.0, attention=0.02, step_overhead=12.0, unit="s", context=0.05)
    grid, cells = 16, 9
    brute = min(
        closed_form_makespan([c * grid for c in sizes], model, pp_size)
        for sizes in compositions(cells)
    )
    bound = limits.best_plan(cells * grid, model, pp_size, grid=grid)
    assert bound.makespan == pytest.approx(brute, rel=1e-12)
    assert bound.lower_bound == pytest.approx(brute, rel=1e-12)
    assert sum(bound.chunks) == cells * grid
    assert closed_form_makespan(list(bound.chunks), model, pp_size) == pytest.approx(bound.makespan)


def test_best_rendezvous_plan_matches_brute_force():
    model = CostModel(linear=1.0, attention=0.02, step_overhead=12.0, unit="s", context=0.05)
    grid, cells = 16, 10
    brute = min(
        simulate([c * grid for c in sizes], model, 2, rendezvous=True).makespan
        for sizes in compositions(cells)
    )
    makespan, chunks = limits.best_rendezvous_plan(cells * grid, model, grid=grid)
    assert makespan == pytest.approx(brute, rel=1e-12)
    assert sum(chunks) == cells * grid
    assert simulate(list(chunks), model, 2, rendezvous=True).makespan == pytest.approx(makespan)
    # A hand-off never helps: the free-flowing optimum is at least as fast.
    assert limits.best_plan(cells * grid, model, 2, grid=grid).makespan <= makespan + 1e-9
    assert limits.best_rendezvous_plan(10, model, grid=16) == (
        pytest.approx(2 * (model.step_overhead + model.chunk_cost(10, 0))),
        (10,),
    )


def test_best_plan_bounds_fixed_and_balanced_plans():
    n = 16384
    bound = limits.best_plan(n, CPU_LIKE, 2)
    assert bound.lower_bound <= bound.makespan <= bound.lower_bound * 1.01
    for chunk in (512, 1024, 2048):
        assert closed_form_makespan(fixed_chunks(n, chunk), CPU_LIKE, 2) >= bound.lower_bound
    for steps in (8, 16, 32):
        plan = plan_chunks(n, CPU_LIKE, budget_for_steps(CPU_LIKE, n, steps))
        assert closed_form_makespan(plan, CPU_LIKE, 2) >= bound.lower_bound
    # The best plan shrinks its chunks as the context grows, like CPP's.
    assert bound.chunks[0] > bound.chunks[-1]


def test_single_stage_ttft_counts_every_stage_but_one_overhead():
    model = CostModel(linear=2.0, attention=0.0, step_overhead=5.0, unit="s")
    # 10 tokens in chunks of 4: steps of 4, 4, 2 tokens, each running both stages' layers.
    assert limits.single_stage_ttft(10, model, 4, 2) == pytest.approx(3 * 5.0 + 2 * 2.0 * 10)


def test_capped_plan_fits_the_step_and_slows_the_prefill():
    n = 16384
    loose = limits.capped_plan(n, CPU_LIKE, 0.2)
    tight = limits.capped_plan(n, CPU_LIKE, 0.04)
    assert sum(loose) == sum(tight) == n
    assert max(stage_times(tight, CPU_LIKE)) <= 0.04
    assert len(tight) > len(loose)
    assert closed_form_makespan(tight, CPU_LIKE, 2) > closed_form_makespan(loose, CPU_LIKE, 2)
    # Below the step overhead plus one token's pass over 16K of context nothing fits.
    hopeless = limits.capped_plan(n, CPU_LIKE, 0.005)
    assert max(stage_times(hopeless, CPU_LIKE)) > 0.005


def test_short_ttft_attainment():
    # u = 0.1 s, SLO 3u: met iff the residual R <= 2.5u - s; with s = 0.2, R <= 0.05 of 0.2.
    assert limits.short_ttft_attainment(0.2, [0.1]) == pytest.approx(0.25)
    assert limits.short_ttft_attainment(0.01, [0.1]) == 1.0
    assert limits.short_ttft_attainment(0.25, [0.1]) == 0.0
    assert limits.short_ttft_attainment(0.2, [0.1, 1.0]) == pytest.approx((0.25 + 1.0) / 2)
    # The interactive regime: max(1 s, 5u); 1 s - 0.05 - 0.5 leaves 0.45 s of a 0.5 s step.
    assert limits.short_ttft_attainment(0.5, [0.1], 5.0, 1.0) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="unloaded_ttft_s"):
        limits.short_ttft_attainment(0.1, [])
    with pytest.raises(ValueError, match="step_s"):
        limits.short_ttft_attainment(0.0, [0.1])
