# SPDX-License-Identifier: Apache-2.0
"""CPPScheduler's chunk sizing, driven through its vLLM hook without an engine.

The engine-level behaviour (same greedy tokens as plain vLLM, prefix caching, preemption) is in
test_cpp_engine.py; here a bare scheduler object runs the hook step by step, as vLLM's schedule()
would, to check the policy itself.
"""

from types import SimpleNamespace

import pytest

from vllm_omni.cpp import handoff
from vllm_omni.cpp.chunking import balance
from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.scheduler import CPPScheduler, plans_for_rendezvous
from vllm_omni.cpp.simulator import simulate

from .test_cost_model import SMALL as SHAPE  # the tiny 8-layer Llama

TOKEN_BUDGET = 8192


def make_scheduler(config: CPPConfig = CPPConfig(), pp_size: int = 2, overhead_tokens: int = 128):
    flops = CostModel.analytic(SHAPE, pp_size=pp_size)
    scheduler = object.__new__(CPPScheduler)  # only the state the hook uses; no vLLM engine
    scheduler.num_prefill_lookahead = 0
    scheduler.pp_size = pp_size
    scheduler.chunk_align = 16
    scheduler.cpp_config = config
    scheduler.cost_model = CostModel(flops.linear, flops.attention, overhead_tokens * flops.linear)
    scheduler.requests = {}
    scheduler._prefill_budgets = {}
    scheduler.rendezvous, scheduler._handoff_plans = (
        False,
        {},
    )  # equal-cost plans unless a test asks
    scheduler._step_budget_left = None
    scheduler.last_step_cost = 0.0
    scheduler._allowances = None  # SLO-aware scheduling off
    scheduler.online, scheduler._dither = None, 1.0  # online calibration off
    return scheduler


def new_step(scheduler):
    scheduler._step_budget_left = None
    scheduler.last_step_cost = scheduler.cost_model.step_overhead


def prefill(scheduler, num_tokens: int, request_id: str = "r") -> list[int]:
    request = SimpleNamespace(request_id=request_id, num_tokens=num_tokens, sampling_params=None)
    chunks, done = [], 0
    while done < num_tokens:
        new_step(scheduler)
        chunk = scheduler._reserve_prefill_lookahead(
            request, done, min(TOKEN_BUDGET, num_tokens - done)
        )
        assert chunk > 0
        chunks.append(chunk)
        done += chunk
    return chunks


@pytest.mark.parametrize("prompt_len", [16384, 32768])
def test_chunks_shrink_and_balance(prompt_len):
    scheduler = make_scheduler()
    chunks = prefill(scheduler, prompt_len)
    assert sum(chunks) == prompt_len
    assert all(c % 16 == 0 for c in chunks[:-1])
    assert chunks[0] > chunks[len(chunks) // 2] > chunks[-2]  # later chunks see more context
    assert balance(chunks, scheduler.cost_model) <= 1.05
    assert not scheduler._prefill_budgets  # the budget is dropped once the prefill is done


def test_num_steps_follows_the_cost_model_or_the_config():
    auto = prefill(make_scheduler(), 16384)
    assert 8 <= len(auto) <= 200
    cheap_steps = prefill(make_scheduler(overhead_tokens=8), 16384)
    assert len(cheap_steps) > len(auto)  # cheaper steps -> more, smaller chunks
    fixed = prefill(make_scheduler(CPPConfig(num_steps=10)), 16384)
    assert 9 <= len(fixed) <= 11


def test_token_budget_still_caps_chunks():
    scheduler = make_scheduler(CPPConfig(num_steps=2))
    request = SimpleNamespace(request_id="r", num_tokens=16384, sampling_params=None)
    new_step(scheduler)
    assert scheduler._reserve_prefill_lookahead(request, 0, 1000) == 1000


def test_decodes_are_charged_but_never_cut():
    scheduler = make_scheduler()
    new_step(scheduler)
    long = SimpleNamespace(request_id="long", num_tokens=16384, sampling_params=None)
    first = scheduler._reserve_prefill_lookahead(long, 0, TOKEN_BUDGET)
    decode = SimpleNamespace(request_id="d", num_tokens=101, sampling_params=None)
    assert scheduler._reserve_prefill_lookahead(decode, 100, 1) == 1
    expected = (
        scheduler.cost_model.step_overhead
        + scheduler.cost_model.chunk_cost(first, 0)
        + scheduler.cost_model.chunk_cost(1, 100)
    )
    assert scheduler.last_step_cost == pytest.approx(expected)


def test_a_second_prefill_gets_what_is_left_of_the_step():
    scheduler = make_scheduler()
    new_step(scheduler)
    a = SimpleNamespace(request_id="a", num_tokens=16384, sampling_params=None)
    b = SimpleNamespace(request_id="b", num_tokens=16384, sampling_params=None)
    chunk_a = scheduler._reserve_prefill_lookahead(a, 0, TOKEN_BUDGET)
    left = scheduler._step_budget_left
    chunk_b = scheduler._reserve_prefill_lookahead(b, 0, TOKEN_BUDGET)
    assert scheduler.cost_model.chunk_cost(chunk_b, 0) <= left
    # Now the step is full: a third prefill waits for the next step instead of overfilling it.
    c = SimpleNamespace(request_id="c", num_tokens=16384, sampling_params=None)
    assert scheduler._reserve_prefill_lookahead(c, 0, TOKEN_BUDGET) == 0
    new_step(scheduler)
    assert scheduler._reserve_prefill_lookahead(c, 0, TOKEN_BUDGET) == chunk_a


def test_a_step_its_first_prefill_overfilled_admits_no_other():
    # The first prefill of a step progresses by at least one block, over budget if need be; a
    # second prefill then finds less than nothing left. It waits: under load on an AVX2 CPU
    # it raised instead ("budget must be >= 0") and the engine died.
    scheduler = make_scheduler()
    new_step(scheduler)
    long = SimpleNamespace(request_id="long", num_tokens=40000, sampling_params=None)
    scheduler._prefill_budgets["long"] = scheduler.cost_model.chunk_cost(8, 30000)
    assert scheduler._reserve_prefill_lookahead(long, 30000, TOKEN_BUDGET) == 16
    assert scheduler._step_budget_left < 0
    short = SimpleNamespace(request_id="short", num_tokens=300, sampling_params=None)
    assert scheduler._reserve_prefill_lookahead(short, 0, 300) == 0
    new_step(scheduler)
    assert scheduler._reserve_prefill_lookahead(short, 0, 300) > 0


def test_short_prompt_runs_whole_and_tail_is_merged():
    scheduler = make_scheduler(CPPConfig(min_chunk=256))
    assert prefill(scheduler, 40, "short") == [40]
    chunks = prefill(scheduler, 16384 + 100, "tail")
    assert chunks[-1] >= 100 and all(c >= 256 for c in chunks)


def test_a_request_can_choose_its_num_steps():
    scheduler = make_scheduler()
    request = SimpleNamespace(
        request_id="r",
        num_tokens=16384,
        sampling_params=SimpleNamespace(extra_args={"cpp_num_steps": 5}),
    )
    chunks, done = [], 0
    while done < 16384:
        new_step(scheduler)
        chunks.append(scheduler._reserve_prefill_lookahead(request, done, TOKEN_BUDGET))
        done += chunks[-1]
    assert 4 <= len(chunks) <= 6


def test_context_pass_cost_means_fewer_larger_chunks():
    plain = make_scheduler()
    with_context = make_scheduler()
    cm = plain.cost_model
    with_context.cost_model = CostModel(
        cm.linear, cm.attention, cm.step_overhead, context=50 * cm.step_overhead / 16384
    )
    assert len(prefill(with_context, 16384)) < len(prefill(plain, 16384))


def test_a_rendezvous_hand_off_gets_the_plan_that_costs_least_under_it():
    equal = make_scheduler()
    scheduler = make_scheduler()
    scheduler.rendezvous = True
    n = 16384
    chunks = prefill(scheduler, n)
    planned, _ = handoff.rendezvous_plan(scheduler.cost_model, n, 0, scheduler.chunk_align)
    assert chunks == planned
    assert not scheduler._handoff_plans  # dropped once the prefill is done

    def cost(plan):
        return simulate(plan, scheduler.cost_model, 2, rendezvous=True).makespan

    assert cost(chunks) < cost(prefill(equal, n))


def test_a_rendezvous_plan_is_cut_again_where_the_prefill_resumes():
    scheduler = make_scheduler()
    scheduler.rendezvous = True
    request = SimpleNamespace(request_id="r", num_tokens=8192, sampling_params=None)
    new_step(scheduler)
    first = scheduler._reserve_prefill_lookahead(request, 0, 8192)
    new_step(scheduler)
    cut_short = scheduler._reserve_prefill_lookahead(request, first, 64)  # vLLM's token budget
    assert cut_short == 64
    new_step(scheduler)
    resumed = scheduler._reserve_prefill_lookahead(request, first + 64, 8192 - first - 64)
    replanned, _ = handoff.rendezvous_plan(scheduler.cost_model, 8192, first + 64, 16)
    assert resumed == replanned[0]


def test_which_pipelines_get_rendezvous_plans():
    assert not plans_for_rendezvous(CPPConfig(), 2)  # free: the default
    assert plans_for_rendezvous(CPPConfig(handoff="rendezvous"), 2)
    for asks_for_equal_cost in (dict(num_steps=8), dict(micro_chunks=2), dict(min_chunk=512)):
        assert not plans_for_rendezvous(CPPConfig(handoff="rendezvous", **asks_for_equal_cost), 2)
    assert not plans_for_rendezvous(CPPConfig(handoff="rendezvous"), 3)
    with pytest.raises(ValueError, match="cpp.handoff"):
        CPPConfig(handoff="sometimes")
