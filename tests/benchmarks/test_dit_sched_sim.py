# SPDX-License-Identifier: Apache-2.0
"""benchmarks/dit_sched_sim.py: the DiT scheduler on a virtual clock, with fixed step costs."""

from argparse import Namespace

import pytest

from benchmarks import dit_sched_sim

# Seconds as (fixed, per request): the tiny Qwen-Image's DiT on a 2-core CPU, about.
COSTS = {64: {"step": (0.003, 0.0003), "decode": (0.01, 0.003)},
         192: {"step": (0.004, 0.001), "decode": (0.01, 0.02)}}  # fmt: skip
SLO_MS = {"small": 236, "large": 1058}


@pytest.fixture(scope="module")
def sim():
    return dit_sched_sim


def _run(sim, policy: str, rate: float, contention: float) -> dict:
    args = Namespace(max_num_seqs=8, pre_ms=30.0, contention=contention)
    return sim.simulate(policy, sim.make_trace(160, rate, seed=0), SLO_MS, COSTS, args)


def test_fit_line_recovers_fixed_and_per_request_cost(sim) -> None:
    fixed, per_row = sim.fit_line([(1, 0.013), (2, 0.016), (4, 0.022), (8, 0.034)])
    assert fixed == pytest.approx(0.010) and per_row == pytest.approx(0.003)
    assert sim.fit_line([(1, 0.02), (2, 0.01)]) == (pytest.approx(0.015), 0.0)  # never < 0


def test_light_load_meets_every_slo_with_both_policies(sim) -> None:
    for policy in ("fcfs", "deadline"):
        result = _run(sim, policy, rate=2.0, contention=1.0)
        assert result["slo_attainment"] == 1.0
        # a small image: 30 ms to reach the DiT, 4-8 steps (sharing some with a large image's
        # at most), one decode
        assert 0.04 < result["small"]["p99_s"] < 0.2


def test_overload_deadline_policy_meets_more_slos_and_starves_nobody(sim) -> None:
    fcfs = _run(sim, "fcfs", rate=14.0, contention=2.5)
    deadline = _run(sim, "deadline", rate=14.0, contention=2.5)
    assert fcfs["slo_attainment"] < 0.9  # an overload: there is something to schedule
    assert deadline["slo_attainment"] > fcfs["slo_attainment"]
    assert deadline["small"]["p99_s"] < fcfs["small"]["p99_s"]
    assert deadline["max_latency_s"] < 60  # the starvation guard: every request finished
