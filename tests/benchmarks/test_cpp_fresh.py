# SPDX-License-Identifier: Apache-2.0
"""benchmarks/cpp_fresh.py's analysis of step records: which pipeline model explains a TTFT."""

import pytest

from benchmarks import cpp_fresh
from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.simulator import simulate


def records_of(timeline) -> list[list[dict]]:
    """Per-rank step records of a simulated prefill, as the CPP worker reports them."""
    return [
        [{"start_s": s.start, "end_s": s.end, "chunks": [[1, 0]]} for s in stage]
        for stage in zip(*timeline)
    ]


def test_handoff_check_tells_the_two_pipelines_apart():
    model = CostModel(linear=1.0, attention=0.0, step_overhead=0.0, unit="s")
    sawtooth = [4, 3, 4, 3, 4, 3]  # every rise costs under the rendezvous hand-off
    for rendezvous in (False, True):
        run = simulate(sawtooth, model, 2, rendezvous=rendezvous)
        check = cpp_fresh.handoff_check([records_of(run.timeline)], [run.makespan])
        expected = "rendezvous" if rendezvous else "buffered"
        assert check[expected] == pytest.approx(1.0)
        other = check["buffered" if rendezvous else "rendezvous"]
        assert (other < 1.0) if rendezvous else (other > 1.0)


def test_step_gaps_count_idle_time_per_rank():
    model = CostModel(linear=1.0, attention=0.0, step_overhead=0.0, unit="s")
    run = simulate([1, 3, 1, 3], model, 2, rendezvous=True)  # test_simulator's hand example
    gaps = cpp_fresh.step_gaps([records_of(run.timeline)])
    assert gaps["first_step_s"] == 1
    first, second = gaps["ranks"]
    assert first["idle_s"] == 2 and first["busy_s"] == 8 and first["steps"] == 4  # waits 5-7
    assert second["idle_s"] == 2 + 0 + 2  # waits 2-4 and 8-10
