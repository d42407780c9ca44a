# SPDX-License-Identifier: Apache-2.0
"""Pipeline simulator for chunked prefill, and the projection / validation script built on it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni.cpp.chunking import budget_for_chunk, plan_chunks
from vllm_omni.cpp.cost_model import CostModel, ModelShape
from vllm_omni.cpp.simulator import (
    Span,
    closed_form_makespan,
    fixed_chunks,
    ideal_bubble,
    simulate,
    stage_times,
)

K = 1024
# chunk_cost(x, L) = x: a chunk's time is its token count, so hand computation is easy.
LINEAR = CostModel(linear=1.0, attention=0.0, step_overhead=0.0, unit="s")
REPO = Path(__file__).resolve().parents[2]


def _load_script():
    from benchmarks import cpp_sim

    return cpp_sim


def test_module_imports_neither_torch_nor_vllm():
    code = (
        "import sys, vllm_omni.cpp.simulator; print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("pp", [1, 2, 5])
def test_one_chunk_crosses_every_stage_in_turn(pp):
    res = simulate([7], LINEAR, pp)
    assert res.makespan == 7 * pp
    assert res.timeline == ((*(Span(k, 7.0 * k, 7.0 * (k + 1)) for k in range(pp)),),)
    assert res.busy == (7.0,) * pp
    assert res.bubble == pytest.approx((pp - 1) / pp)
    assert res.ideal_bubble == pytest.approx((pp - 1) / pp)


@pytest.mark.parametrize("m,pp", [(1, 4), (3, 2), (8, 4), (32, 8), (5, 16)])
def test_equal_chunks_take_m_plus_p_minus_1_steps(m, pp):
    res = simulate([4] * m, LINEAR, pp)
    assert res.makespan == (m + pp - 1) * 4
    assert res.bubble == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-12)
    assert res.bubble == pytest.approx(res.ideal_bubble, rel=1e-12)
    assert res.idle == pytest.approx(pp * (m + pp - 1) * 4 - pp * m * 4)


def test_unequal_chunks_by_hand():
    # Stage 0 runs 0-1, 1-4, 4-6; stage 1 waits for each chunk: 1-2, 4-7, 7-9.
    res = simulate([1, 3, 2], LINEAR, 2)
    assert [[(s.start, s.end) for s in spans] for spans in res.timeline] == [
        [(0, 1), (1, 2)],
        [(1, 4), (4, 7)],
        [(4, 6), (7, 9)],
    ]
    assert res.makespan == 9 == 6 + (2 - 1) * 3
    assert res.bubble == pytest.approx(1 - 6 / 9)


def test_stage_times_use_the_context_before_each_chunk_and_the_step_overhead():
    model = CostModel(linear=2.0, attention=0.5, step_overhead=3.0, unit="s")
    times = stage_times([4, 2], model, start=10)
    assert times == [model.chunk_cost(4, 10) + 3.0, model.chunk_cost(2, 14) + 3.0]
    assert simulate([4, 2], model, 3, start=10).stage_times == tuple(times)


def test_comm_adds_once_per_stage_hop():
    # Equal chunks: the critical path makes p - 1 hops, each paying comm_s.
    m, pp, s, comm = 6, 4, 5.0, 0.75
    res = simulate([5] * m, LINEAR, pp, comm_s=comm)
    assert res.makespan == pytest.approx((m + pp - 1) * s + (pp - 1) * comm)
    # Stage k of chunk 0 starts after k computes and k hops.
    assert [span.start for span in res.timeline[0]] == [k * (s + comm) for k in range(pp)]
    assert res.busy == (m * s,) * pp  # sending is not computing


@pytest.mark.parametrize("order", ["increasing", "decreasing", "shuffled"])
@pytest.mark.parametrize("comm", [0.0, 0.3])
def test_closed_form_is_exact_for_any_chunk_order(order, comm):
    rng = random.Random(f"{order}-{comm}")
    model = CostModel(linear=1.0, attention=0.01, step_overhead=2.0, unit="s")
    for _ in range(200):
        chunks = [rng.randint(1, 64) for _ in range(rng.randint(1, 12))]
        if order != "shuffled":
            chunks.sort(reverse=order == "decreasing")
        pp, start = rng.randint(1, 9), rng.randint(0, 100)
        res = simulate(chunks, model, pp, start=start, comm_s=comm)
        closed = closed_form_makespan(chunks, model, pp, start=start, comm_s=comm)
        assert res.makespan == pytest.approx(closed, rel=1e-12)
        busy = sum(res.stage_times)
        assert res.bubble == pytest.approx(1 - busy / closed, rel=1e-9, abs=1e-12)


def test_in_flight_cap_binds_only_where_documented():
    # Monotone chunk times, comm 0, cap >= p: never binds.
    rng = random.Random(1)
    for _ in range(300):
        chunks = sorted(rng.randint(1, 20) for _ in range(rng.randint(1, 12)))
        if rng.random() < 0.5:
            chunks.reverse()
        pp = rng.randint(1, 6)
        cap = rng.randint(pp, pp + 3)
        assert simulate(chunks, LINEAR, pp, max_in_flight=cap).makespan == pytest.approx(
            closed_form_makespan(chunks, LINEAR, pp)
        )
    # A mixed order binds even at cap == p (the module docstring's example).
    chunks = [19, 10, 15, 3, 20, 13, 11, 19, 8]
    assert closed_form_makespan(chunks, LINEAR, 5) == 198
    assert simulate(chunks, LINEAR, 5, max_in_flight=5).makespan == 223
    # With comm, chunk 2 (cap 2) waits for chunk 0 to leave stage 1 and come back: 3 + 1.
    res = simulate([1, 1, 1], LINEAR, 2, comm_s=1.0, max_in_flight=2)
    assert res.timeline[2][0] == Span(0, 4.0, 5.0)
    assert res.makespan == 7 and simulate([1, 1, 1], LINEAR, 2, comm_s=1.0).makespan == 5


def test_rendezvous_by_hand():
    # Stage 0 finishes chunk 2 at 5 but holds it until stage 1 takes it at 7, so chunk 3 runs on
    # stage 0 at 7-10 instead of 5-8, and the prefill ends at 13 instead of 11.
    res = simulate([1, 3, 1, 3], LINEAR, 2, rendezvous=True)
    assert [[(s.start, s.end) for s in spans] for spans in res.timeline] == [
        [(0, 1), (1, 2)],
        [(1, 4), (4, 7)],
        [(4, 5), (7, 8)],
        [(7, 10), (10, 13)],
    ]
    assert res.makespan == 13 == 8 + 1 + (2 + 2)  # sum + first + rises
    assert simulate([1, 3, 1, 3], LINEAR, 2).makespan == 11 == 8 + 3  # sum + max


@pytest.mark.parametrize("comm", [0.0, 0.4])
def test_rendezvous_two_stage_closed_form_and_bounds(comm):
    rng = random.Random(f"rendezvous-{comm}")
    model = CostModel(linear=1.0, attention=0.01, step_overhead=2.0, unit="s")
    for _ in range(300):
        chunks = [rng.randint(1, 64) for _ in range(rng.randint(1, 12))]
        times = stage_times(chunks, model)
        res = simulate(chunks, model, 2, comm_s=comm, rendezvous=True)
        rises = sum(max(0.0, b - a) for a, b in zip(times, times[1:]))
        if comm == 0:
            assert res.makespan == pytest.approx(sum(times) + times[0] + rises, rel=1e-12)
        pp = rng.randint(2, 6)
        free = simulate(chunks, model, pp, comm_s=comm).makespan
        assert simulate(chunks, model, pp, comm_s=comm, rendezvous=True).makespan >= free - 1e-9
        # Without send time, non-decreasing step times never wait for a hand-off (two stages).
        ordered = sorted(chunks)
        if comm == 0:
            assert simulate(ordered, model, 2, rendezvous=True).makespan == pytest.approx(
                simulate(ordered, model, 2).makespan, rel=1e-12
            )


@pytest.mark.parametrize("m,pp", [(3, 2), (8, 4), (5, 16)])
def test_rendezvous_equal_chunks_lose_nothing(m, pp):
    assert simulate([4] * m, LINEAR, pp, rendezvous=True).makespan == (m + pp - 1) * 4


def test_fixed_chunks_and_ideal_bubble():
    assert fixed_chunks(10, 4) == [4, 4, 2]
    assert fixed_chunks(8, 4) == [4, 4]
    assert fixed_chunks(0, 4) == []
    assert fixed_chunks(3, 4) == [3]
    assert ideal_bubble(32, 4) == 3 / 35
    assert ideal_bubble(1, 1) == 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(chunks=[]),
        dict(chunks=[4, 0]),
        dict(pp_size=0),
        dict(comm_s=-1.0),
        dict(max_in_flight=0),
        dict(start=-1),
    ],
)
def test_rejects_bad_arguments(bad):
    kwargs = dict(chunks=[4, 4], cost_model=LINEAR, pp_size=2) | bad
    with pytest.raises(ValueError):
        simulate(**kwargs)


# papers.md A13: Llama-3-8B, FLOP-proportional time, fixed 4096-token chunks, no overhead.
A13_FIXED = [
    (128 * K, 4, 13.7),
    (128 * K, 8, 27.0),
    (128 * K, 16, 44.2),
    (1024 * K, 4, 2.2),
    (1024 * K, 8, 5.1),
    (1024 * K, 16, 10.2),
]


@pytest.mark.parametrize("prompt_len,pp,expected_pct", A13_FIXED)
def test_projection_reproduces_papers_a13_fixed_chunks(prompt_len, pp, expected_pct):
    model = CostModel.analytic(ModelShape.llama3_8b(), pp)  # no LM head, c = 0, as A13
    res = simulate(fixed_chunks(prompt_len, 4096), model, pp)
    assert 100 * res.bubble == pytest.approx(expected_pct, abs=0.1)


@pytest.mark.parametrize("pp,expected_pct", [(4, 0.3), (8, 0.7), (16, 1.5)])
def test_projection_reproduces_a13_equal_flop_chunks_at_1m(pp, expected_pct):
    model = CostModel.analytic(ModelShape.llama3_8b(), pp)
    chunks = plan_chunks(1024 * K, model, budget_for_chunk(model, 16384), block_size=16)
    assert 1000 < len(chunks) < 1030  # A13: "~1014 chunks shrinking to ~530 tokens"
    res = simulate(chunks, model, pp)
    assert 100 * res.bubble == pytest.approx(expected_pct, abs=0.1)
    if pp == 8:
        assert res.bubble <= 0.01


def test_script_validation_round_trip(tmp_path):
    """Records whose TTFT is the simulator's own prediction validate with zero error; a model
    calibrated at another pp is rescaled by layers per stage."""
    cpp_sim = _load_script()
    model = CostModel(linear=2e-5, attention=1e-8, step_overhead=5e-3, unit="s")
    records = []
    for pp, chunks in (
        (2, [2048] * 8),
        (2, [4096, 3072, 2560, 2048, 1792, 1600, 1296]),
        (1, [2048] * 8),
    ):
        per_stage = cpp_sim.rescale(model, 2, pp)
        ttft = simulate(chunks, per_stage, pp, max_in_flight=pp).makespan
        records.append(
            {
                "name": f"pp{pp}",
                "pp": pp,
                "prompt_len": sum(chunks),
                "chunks": chunks,
                "ttft_s": ttft,
            }
        )
    path = tmp_path / "measured.json"
    path.write_text(
        json.dumps({"cost_model": model.to_dict(), "cost_model_pp": 2, "records": records})
    )
    rows = cpp_sim.validate(cpp_sim.load_measured(path))
    assert [r["rel_err"] for r in rows] == pytest.approx([0.0] * 3, abs=1e-12)
    assert [r["scaled"] for r in rows] == [False, False, True]
    # --cost-model overrides the file's model; a bare list of records needs one.
    slower = CostModel(linear=4e-5, attention=2e-8, step_overhead=1e-2, unit="s")
    rows = cpp_sim.validate(cpp_sim.load_measured(path, slower))
    assert rows[0]["rel_err"] == pytest.approx(1.0)
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match="cost model"):
        cpp_sim.load_measured(path)


def test_script_main_writes_json(tmp_path, capsys):
    cpp_sim = _load_script()
    out = tmp_path / "sim.json"
    assert (
        cpp_sim.main(
            ["--models", "llama3-8b", "--pp", "8", "--contexts", "1024", "--json", str(out)]
        )
        == 0
    )
    assert "bubble 0.69% (<= 1%)" in capsys.readouterr().out
    data = json.loads(out.read_text())
    rows = [r for r in data["projection"] if r["step_overhead_flop"] == 0]
    assert len(rows) == 1 and rows[0]["fixed"]["bubble"] == pytest.approx(0.0506, abs=5e-4)
    assert "sched" in [r for r in data["projection"] if r["step_overhead_flop"] > 0][0]
