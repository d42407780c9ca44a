# SPDX-License-Identifier: Apache-2.0
"""SLO-aware step sharing: the pure policy, and the CPPScheduler driving it without an engine."""

from __future__ import annotations

import math
import time
from collections import deque
from types import SimpleNamespace

import pytest
from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy

from vllm_omni.cpp import slo
from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.scheduler import CPPScheduler
from vllm_omni.cpp.slo_ledger import SLOLedger

# The calibrated model of the tiny Llama at PP=2 on this machine (seconds).
COST = CostModel(2.26e-5, 1.02e-8, 1.9e-3, unit="s", context=5.9e-7)


def test_request_slo_parsing() -> None:
    defaults = slo.SLOTargets(ttft_s=1.0, tpot_s=None)
    assert slo.request_slo(None, defaults) == defaults
    got = slo.request_slo({"ttft_slo_ms": 250, "tpot_slo_ms": 40.5}, defaults)
    assert got == slo.SLOTargets(ttft_s=0.25, tpot_s=0.0405)
    for bad in (0, -5, "100", True, math.inf):
        with pytest.raises(ValueError, match=r"^vllm_xargs\.ttft_slo_ms:"):
            slo.request_slo({"ttft_slo_ms": bad}, defaults)


def _demand(rid, arrival, ttft, step, remaining=None, priority=0):
    return slo.PrefillDemand(rid, arrival, priority, ttft, step, remaining or step)


def test_order_smallest_remaining_first() -> None:
    now = 100.0
    long = _demand("long", 90.0, ttft=30.0, step=0.3, remaining=3.0)  # 10 s in, 30 s SLO
    short = _demand("short", 99.9, ttft=0.25, step=0.03)  # just arrived, tight SLO
    plain = _demand("plain", 50.0, ttft=None, step=0.1)  # no SLO: after those with one
    ordered = slo.order([plain, long, short], now, step_s=0.1, pp_size=2, max_wait_s=60)
    assert [d.request_id for d in ordered] == ["short", "long", "plain"]
    # Priority ranks before slack; a starved request goes first of all.
    urgent = _demand("vip", 99.0, ttft=None, step=0.1, priority=-1)
    ordered = slo.order([long, short, urgent], now, 0.1, 2, 60)
    assert ordered[0].request_id == "vip"
    ordered = slo.order([long, short, plain], now, 0.1, 2, max_wait_s=45)
    assert ordered[0].request_id == "plain"  # waited 50 s > 45 s


def test_a_late_long_prefill_yields_and_one_about_to_miss_goes_first() -> None:
    now = 100.0
    short = _demand("short", 99.5, ttft=1.0, step=0.03)  # 0.47 s of slack left
    # Late already (deadline 99 s): it keeps its place by size; before session 18 its negative
    # relative slack put it ahead of every short request.
    late = _demand("late", 80.0, ttft=19.0, step=0.3, remaining=5.0)
    assert [d.request_id for d in slo.order([late, short], now, 0.1, 2, 60)] == ["short", "late"]
    # Can still make it (deadline 105.15 s, 5.1 s predicted) but not if it waits one more step.
    tight = _demand("tight", 80.0, ttft=25.15, step=0.3, remaining=5.0)
    assert 0 <= slo.slack(tight, now, 0.1, 2) < 0.1
    assert [d.request_id for d in slo.order([short, tight], now, 0.1, 2, 60)] == ["tight", "short"]


def test_allocate_and_cap() -> None:
    ordered = [_demand("a", 0, 1, 0.05), _demand("b", 0, 1, 0.3), _demand("c", 0, 1, 0.1)]
    assert slo.allocate(ordered, 0.2) == {"a": 0.05, "b": pytest.approx(0.15)}
    # The most urgent always gets at least its smallest chunk; the rest only what is left.
    tight = [slo.PrefillDemand("a", 0, 0, 1, 0.3, 3.0, min_cost=0.04), *ordered[1:]]
    assert slo.allocate(tight, 0.01) == {"a": 0.04}
    assert slo.allocate(tight, 0.1) == {"a": 0.1}
    # A request whose smallest chunk does not fit is skipped; a smaller one behind it fits.
    skip = [
        ordered[0],
        slo.PrefillDemand("big", 0, 0, 1, 0.3, 3.0, min_cost=0.2),
        _demand("small", 0, 1, 0.05),
    ]
    assert slo.allocate(skip, 0.15) == {"a": 0.05, "small": 0.05}
    assert slo.step_budget_cap([None, 0.3, 0.9], steps_in_flight=2) == pytest.approx(0.1)
    assert slo.step_budget_cap([None], 2) == math.inf


def test_config_and_flags_validation() -> None:
    with pytest.raises(ValueError, match=r"cpp.ttft_slo_ms needs cpp.slo"):
        CPPConfig(ttft_slo_ms=200)
    with pytest.raises(ValueError, match=r"cpp.tpot_slo_ms must be a positive number"):
        CPPConfig(slo=True, tpot_slo_ms=-1)
    with pytest.raises(ValueError, match=r"cpp.max_wait_s"):
        CPPConfig(slo=True, max_wait_s=0)
    assert CPPConfig.from_dict({"slo": True, "ttft_slo_ms": 300}).ttft_slo_ms == 300


def _request(rid, num_tokens, computed=0, ttft_ms=None, arrival=None):
    extra = {"ttft_slo_ms": ttft_ms} if ttft_ms else {}
    return SimpleNamespace(
        request_id=rid,
        num_tokens=num_tokens,
        num_computed_tokens=computed,
        arrival_time=arrival if arrival is not None else time.time(),
        priority=0,
        sampling_params=SimpleNamespace(extra_args=extra),
    )


def _slo_scheduler() -> CPPScheduler:
    s = object.__new__(CPPScheduler)  # only the state the SLO planner and the hook use
    s.num_prefill_lookahead = 0
    s.pp_size = 2
    s.chunk_align = 128
    s.cpp_config = CPPConfig(slo=True)
    s.cost_model = COST
    s.requests = {}
    s._prefill_budgets, s._slos, s._recent_ttft = {}, {}, deque()
    s._step_budget_left, s.last_step_cost = None, COST.step_overhead
    s.slo_defaults = slo.SLOTargets()
    s.slo_ledger = SLOLedger(None)
    s.steps_in_flight = 3
    s.policy = SchedulingPolicy.FCFS
    s.running, s.waiting = [], FCFSRequestQueue()
    return s


def test_long_prefill_yields_to_an_urgent_short_request() -> None:
    s = _slo_scheduler()
    long = _request("long", 24576, computed=8192, ttft_ms=60_000, arrival=time.time() - 5)
    decode = _request("decode", 300, computed=299)
    s.running = [long, decode]
    s._allowances = s._plan_slo_step(0.1)
    alone = s._slo_chunk(long, long.num_computed_tokens, 8192)

    short = _request("short", 1024, ttft_ms=300)
    plain = _request("plain", 512)
    s.waiting.extend([plain, short])
    s._allowances = s._plan_slo_step(0.1)
    assert [r.request_id for r in s.running] == ["decode", "long"]  # decodes first
    assert [r.request_id for r in s.waiting] == ["short", "plain"]  # SLO first, then SRPT
    shared = s._slo_chunk(long, long.num_computed_tokens, 8192)
    assert s._slo_chunk(short, 0, 1024) == 1024  # the whole short prompt this step
    assert 0 < shared < alone  # the long prefill yields part of the step, but progresses
    # The step is capped for the 300 ms SLO: a request arriving now waits for 3 steps in flight.
    step = COST.chunk_cost(shared, long.num_computed_tokens) + COST.chunk_cost(1024, 0)
    assert step <= 0.3 / 4 + 1e-9


def test_step_cap_keeps_a_useful_chunk() -> None:
    """A TTFT SLO too tight for any useful step leaves the long prefill its plain CPP chunk: a
    cap below 4 KV blocks cannot make that SLO attainable, it would only slow everything."""
    s = _slo_scheduler()
    long = _request("long", 32768, computed=16384, arrival=time.time() - 5)  # no SLO of its own
    s.running = [long]
    s._allowances = s._plan_slo_step(0.05)
    uncapped = s._slo_chunk(long, long.num_computed_tokens, 8192)  # plain CPP's chunk
    s._recent_ttft.append((time.monotonic(), 0.06))  # a 60 ms TTFT SLO seen recently
    s._allowances = s._plan_slo_step(0.05)
    assert COST.chunk_cost(4 * s.chunk_align, long.num_computed_tokens) > 0.06 / 4
    assert s._slo_chunk(long, long.num_computed_tokens, 8192) == uncapped >= 4 * s.chunk_align


def test_step_cap_applies_where_a_useful_chunk_fits() -> None:
    s = _slo_scheduler()
    long = _request("long", 32768, computed=16384, arrival=time.time() - 5)
    s.running = [long]
    s._allowances = s._plan_slo_step(0.05)
    uncapped = s._slo_chunk(long, long.num_computed_tokens, 8192)
    floor = COST.chunk_cost(4 * s.chunk_align, long.num_computed_tokens) + COST.step_overhead
    s._recent_ttft.append((time.monotonic(), 4 * floor * 1.5))  # room for 1.5 useful chunks
    s._allowances = s._plan_slo_step(0.05)
    capped = s._slo_chunk(long, long.num_computed_tokens, 8192)
    assert 4 * s.chunk_align <= capped < uncapped
