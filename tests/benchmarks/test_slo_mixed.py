# SPDX-License-Identifier: Apache-2.0
"""benchmarks/slo_mixed.py: repeats of one configuration merged into one row."""

import pytest

from benchmarks import slo_mixed


@pytest.fixture(scope="module")
def bench():
    return slo_mixed


def _run(bench, goodput: float, attainment: float, ratios: list[float]) -> dict:
    run = {key: attainment for key in bench.SCALARS}
    run.update(goodput_rps=goodput, long_ttft_over_solo=ratios, requests=[{"ttft_s": goodput}])
    return run


def test_merged_takes_medians_and_keeps_every_run(bench) -> None:
    runs = [_run(bench, 0.3, 0.9, [1.0, 2.0]), _run(bench, 0.1, 0.5, [1.2, 1.0]),
            _run(bench, 0.2, 0.7, [1.1, 3.0])]  # fmt: skip
    out = bench.merged(runs)
    assert out["goodput_rps"] == 0.2 and out["short_ttft_attainment"] == 0.7
    assert out["long_ttft_over_solo"] == [1.1, 2.0]  # per long prompt, across runs
    assert out["runs"] == runs and "requests" not in out  # per-request records stay per run


def test_one_run_is_its_own_merge(bench) -> None:
    run = _run(bench, 0.3, 0.9, [1.0])
    assert bench.merged([run]) is run
