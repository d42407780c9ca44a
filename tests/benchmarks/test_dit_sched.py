# SPDX-License-Identifier: Apache-2.0
"""benchmarks/dit_sched.py: how a replayed trace is scored (no server started)."""

import pytest

from benchmarks import dit_sched

SLO_MS = {"small": 100.0, "large": 300.0}


@pytest.fixture(scope="module")
def bench():
    return dit_sched


def _jobs(bench, kinds: str) -> list:
    return [
        bench.Job(i, 0.1 * i, "small" if k == "s" else "large", 64 if k == "s" else 192, 4)
        for i, k in enumerate(kinds)
    ]


def test_refused_requests_count_as_missed_and_in_no_percentile(bench) -> None:
    trace = _jobs(bench, "ssssl")
    results = {
        0: (0.05, None),  # met
        1: (0.09, None),  # met
        2: (0.20, None),  # served, late
        3: (0.001, bench.REFUSED),  # refused at once: would be the fastest
        4: (0.25, None),  # large, met
    }
    out = bench.summarize(trace, results, SLO_MS, span=2.0)
    assert out["refused"] == 1 and out["errors"] == 0
    assert out["slo_attainment"] == pytest.approx(3 / 5)
    assert out["goodput_rps"] == pytest.approx(1.5)
    small = out["small"]
    assert small["n"] == 4 and small["refused"] == 1
    assert small["slo_attainment"] == pytest.approx(2 / 4)  # of all small requests, refused too
    assert small["p50_s"] == pytest.approx(0.09)  # of the three served: 0.05, 0.09, 0.20
    assert out["max_latency_s"] == pytest.approx(0.25)


def test_other_errors_are_errors_and_a_trace_without_large_requests_has_no_large_class(
    bench,
) -> None:
    trace = _jobs(bench, "ss")
    out = bench.summarize(trace, {0: (0.05, None), 1: (0.3, "APIConnectionError")}, SLO_MS, 1.0)
    assert out["errors"] == 1 and out["refused"] == 0
    assert "large" not in out and out["small"]["slo_attainment"] == pytest.approx(0.5)


def test_floor_ratios_pair_runs_by_index(bench) -> None:
    def run(p99: float) -> dict:
        return {"slo_attainment": 0.5, "small": {"p99_s": p99}, "large": {"p99_s": 1.0}}

    runs = {
        "fcfs": [run(0.4), run(0.2)],
        "deadline": [run(0.2), run(0.2)],
        "floor": [{"slo_attainment": 1.0, "small": {"p99_s": 0.1}}] * 2,
    }
    ratios = bench.paired_ratios(runs)
    assert ratios["small_p99"] == pytest.approx((0.5 * 1.0) ** 0.5)
    assert ratios["floor_small_p99"] == pytest.approx((0.25 * 0.5) ** 0.5)
    assert ratios["deadline_over_floor_small_p99"] == pytest.approx(2.0)
    assert "floor_small_p99" not in bench.paired_ratios({k: runs[k] for k in ("fcfs", "deadline")})
