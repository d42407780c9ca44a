# SPDX-License-Identifier: Apache-2.0
"""CPPScheduler: vLLM's scheduler with a per-step compute budget that sizes prefill chunks.

vLLM already pipelines the chunks of one prompt through the PP stages: it advances a request's
`num_computed_tokens` when it schedules a chunk, so the next `schedule()` issues the following chunk
while the previous one is still in a later stage. But it cuts fixed-size chunks, and a chunk costs
more the more context precedes it (attention), so the stages wait on each other:

    fixed chunks   stage 0 |c0|c1 |c2  |c3   |         later chunks cost more; stage 1 idles
                   stage 1    |c0|c1 |c2  |c3   |      while stage 0 computes the next, longer one
    CPP chunks     stage 0 |c0   |c1  |c2 |c3|         equal cost: chunks shrink as context grows
                   stage 1       |c0  |c1 |c2 |c3|

For each long prefill CPP fixes a budget B = T / m when the request is first scheduled (T: the
prefill's cost per stage from the CostModel, m: the number of steps that minimises the predicted
time, see chunking.optimal_num_steps); every step then takes the largest block-aligned chunk that
fits what is left of B. With `cpp.handoff=rendezvous` (vLLM's CPU pipeline hands a chunk on only
when the next stage takes it, so every rise of the step time from one chunk to the next costs),
the prefill leading a step instead follows the plan that costs least under that hand-off
(vllm_omni.cpp.handoff), cut when it first leads one. Decodes are charged but never cut.
Everything else - KV allocation, prefix caching, preemption, aborts - is vLLM's own scheduler,
reached through one hook, `_reserve_prefill_lookahead`, which vLLM calls for every request it is
about to schedule.
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from vllm_omni.cpp import handoff, slo
from vllm_omni.cpp.chunking import next_chunk_size, prefill_budget
from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.cost_model import write_json_atomic
from vllm_omni.cpp.cost_model_source import (
    StartingModel,
    calibration_path_for,
    starting_cost_model,
)
from vllm_omni.cpp.online_fit import EXPLORE_DITHER, OnlineCalibration, OnlineCostModel
from vllm_omni.cpp.slo_ledger import SLOLedger
from vllm_omni.cpp.worker import STEP_TIMES_ATTR
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

RECENT_SLO_WINDOW_S = 30.0
"""TTFT SLOs seen this recently keep capping the step length (traffic with tight SLOs is around)."""

MIN_USEFUL_CHUNK_BLOCKS = 4
"""SLO mode caps a step only where it still holds this many KV blocks of the longest prefill."""

NUM_STEPS_ARG = "cpp_num_steps"
"""Per-request override of CPPConfig.num_steps in SamplingParams.extra_args (OpenAI: vllm_xargs)."""


def last_rank_scale(vllm_config) -> float:
    """Busy times come from the last PP rank (it returns the step's output); the cost model is
    the heaviest stage's, so they are scaled by heaviest / last rank's number of layers."""
    from vllm.distributed.utils import get_pp_indices

    pp_size = vllm_config.parallel_config.pipeline_parallel_size
    num_layers = getattr(vllm_config.model_config.hf_text_config, "num_hidden_layers", None)
    if pp_size == 1 or not num_layers:
        return 1.0
    sizes = [
        end - start
        for start, end in (get_pp_indices(num_layers, r, pp_size) for r in range(pp_size))
    ]
    return max(sizes) / sizes[-1] if sizes[-1] else 1.0


def plans_for_rendezvous(config: CPPConfig, pp_size: int) -> bool:
    """Whether prefills are planned for a rendezvous hand-off between the stages (see
    CPPConfig.handoff); the plan is for two stages, and micro-chunks and a fixed number of
    steps or smallest chunk ask for the equal-cost plan."""
    if config.handoff != "rendezvous":
        return False
    plannable = (
        pp_size == 2 and config.micro_chunks == 1 and not config.num_steps and not config.min_chunk
    )
    if not plannable:
        logger.warning(
            "CPP: cpp.handoff=rendezvous plans two stages without micro-chunks, num_steps or "
            "min_chunk; planning equal-cost chunks instead"
        )
    return plannable


def requested_num_steps(request: Request) -> int | None:
    params = request.sampling_params
    value = params.extra_args.get(NUM_STEPS_ARG) if params and params.extra_args else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class CPPScheduler(Scheduler):
    """vLLM Scheduler whose prefill chunks are sized by a compute budget per step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        config = CPPConfig.from_additional_config(self.vllm_config.additional_config)
        self.cpp_config = config or CPPConfig()
        self.pp_size = self.vllm_config.parallel_config.pipeline_parallel_size
        self.chunk_align = self.cpp_config.chunk_align or self.block_size
        start = starting_cost_model(self.cpp_config, self.vllm_config)
        self.cost_model = start.model
        self.online = self._start_online_calibration(start)
        self.rank_scale = last_rank_scale(self.vllm_config)
        self._dither = 1.0
        self._prefill_budgets: dict[str, float] = {}
        self.rendezvous = plans_for_rendezvous(self.cpp_config, self.pp_size)
        # Per request: where its rendezvous plan goes on, and the chunks still to come.
        self._handoff_plans: dict[str, tuple[int, deque[int]]] = {}
        self._step_budget_left: float | None = None
        self.last_step_cost = 0.0
        # SLO-aware scheduling (cpp.slo): per-request targets, this step's allowances, and the
        # TTFT SLOs seen lately (they cap the step length while such traffic is around).
        cfg = self.cpp_config
        self.slo_defaults = slo.SLOTargets.from_ms(cfg.ttft_slo_ms, cfg.tpot_slo_ms)
        self._slos: dict[str, slo.SLOTargets] = {}
        self._recent_ttft: deque[tuple[float, float]] = deque()
        self._allowances: dict[str, float] | None = None
        self._most_urgent: str | None = None
        self.steps_in_flight = self.pp_size + cfg.lookahead_steps
        self.slo_ledger = SLOLedger(cfg.ledger_path) if cfg.slo else None
        if cfg.admission and self.cost_model.unit != "s":
            logger.warning(
                "CPP: admission control needs a calibrated cost model (seconds); with the "
                "analytic one no request is refused (run `python -m vllm_omni.cpp.calibrate`)"
            )
        logger.info(
            "CPP scheduler: pp=%d, cost model %s, num_steps=%s, min_chunk=%d, plans for a %s "
            "hand-off",
            self.pp_size,
            self.cost_model,
            self.cpp_config.num_steps or "auto",
            self.cpp_config.min_chunk,
            "rendezvous" if self.rendezvous else "free",
        )

    def _start_online_calibration(self, start: StartingModel) -> OnlineCalibration | None:
        cfg = self.cpp_config
        status_path = Path(cfg.status_path) if cfg.status_path else None
        if not cfg.online_calibration:
            if status_path is not None:
                status = {"source": start.source, "model": start.model.to_dict()}
                write_json_atomic(status_path, status)
            return None
        return OnlineCalibration(
            OnlineCostModel(start.model, start.source, start.fitted_steps),
            cache_path=calibration_path_for(self.vllm_config),
            status_path=status_path,
        )

    def _follow_online_fit(self) -> None:
        """Plan with the newest online fit; while the model has no scale in seconds, alternate
        long and short steps so the fit can tell its terms apart (online_fit.EXPLORE_DITHER)."""
        if self.online is None:
            return
        adopted = self.online.poll()
        if adopted is not None:
            if adopted.model.unit != self.cost_model.unit:
                # Budgets in FLOPs mean nothing to a model in seconds: the rest of each prefill
                # is planned anew. Budgets in seconds stay: the next prefills use the new fit.
                self._prefill_budgets.clear()
            self.cost_model = adopted.model
        if self.online.online.exploring and self._prefill_budgets:
            self._dither = 1 - EXPLORE_DITHER if self._dither > 1 else 1 + EXPLORE_DITHER
        else:
            self._dither = 1.0

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self._follow_online_fit()
        # The first prefill a step meets sets the step's budget (see _reserve_prefill_lookahead).
        self._step_budget_left = None
        previous_step_cost, self.last_step_cost = self.last_step_cost, self.cost_model.step_overhead
        if len(self._prefill_budgets) > len(self.requests) + 64:
            self._prefill_budgets = {
                rid: b for rid, b in self._prefill_budgets.items() if rid in self.requests
            }
        if len(self._handoff_plans) > len(self.requests) + 64:
            self._handoff_plans = {
                rid: p for rid, p in self._handoff_plans.items() if rid in self.requests
            }
        if len(self._slos) > len(self.requests) + 64:
            self._slos = {rid: t for rid, t in self._slos.items() if rid in self.requests}
            if self.slo_ledger is not None:
                self.slo_ledger.keep_only(self.requests)
        self._allowances = self._plan_slo_step(previous_step_cost) if self.cpp_config.slo else None
        return super().schedule(throttle_prefills)

    # ------------------------------------------------------------------ SLO-aware steps
    def request_slo(self, request: Request) -> slo.SLOTargets:
        targets = self._slos.get(request.request_id)
        if targets is None:
            params = request.sampling_params
            try:
                targets = slo.request_slo(params.extra_args if params else None, self.slo_defaults)
            except ValueError as e:  # the API layer should have refused it; never fail a step
                logger.warning("request %s: %s; using the defaults", request.request_id, e)
                targets = self.slo_defaults
            self._slos[request.request_id] = targets
            if self.slo_ledger is not None:
                self.slo_ledger.track(request.request_id, request.arrival_time, targets)
            if targets.ttft_s is not None:
                self._recent_ttft.append((time.monotonic(), targets.ttft_s))
        return targets

    def _demand(self, request: Request, whole_below: float) -> slo.PrefillDemand:
        """What this prefill asks of the step: its CPP chunk, or all of it when that costs
        less than `whole_below` (a short prompt finishes in one step instead of pipelining
        over several: its first token comes sooner)."""
        computed = request.num_computed_tokens
        remaining = request.num_tokens - computed
        remaining_cost = self.cost_model.chunk_cost(remaining, computed)
        if remaining_cost <= whole_below:
            step_cost = remaining_cost
        else:
            chunk = next_chunk_size(
                self.cost_model,
                computed,
                remaining,
                self.prefill_budget(request, computed),
                self.chunk_align,
                self.cpp_config.min_chunk,
            )
            step_cost = self.cost_model.chunk_cost(chunk, computed)
        smallest = min(remaining, max(self.chunk_align, self.cpp_config.min_chunk))
        return slo.PrefillDemand(
            request_id=request.request_id,
            arrival=request.arrival_time,
            priority=request.priority,
            ttft_s=self.request_slo(request).ttft_s,
            step_cost=step_cost,
            remaining_cost=remaining_cost,
            min_cost=self.cost_model.chunk_cost(smallest, computed),
        )

    def _plan_slo_step(self, step_s: float) -> dict[str, float]:
        """Order this step's prefills (smallest remaining first, deadlines guarded) and give each
        its share of the step budget; decodes come first and are never cut (vllm_omni.cpp.slo)."""
        prefills, decode_cost, tpots = [], 0.0, []
        for request in self.running:
            if request.num_tokens - request.num_computed_tokens <= 1:
                decode_cost += self.cost_model.chunk_cost(1, request.num_computed_tokens)
                tpot = self.request_slo(request).tpot_s
                if tpot is not None:
                    tpots.append(tpot)
            else:
                prefills.append(request)
        prefills += list(self.waiting)
        self._most_urgent = None
        if not prefills:
            self._publish_slo_ledger([])
            return {}
        for request in prefills:
            self.request_slo(request)  # records the TTFT SLOs in play before the cap
        now_mono = time.monotonic()
        while self._recent_ttft and now_mono - self._recent_ttft[0][0] > RECENT_SLO_WINDOW_S:
            self._recent_ttft.popleft()
        cap = math.inf
        if self.cost_model.unit == "s":  # SLOs are in seconds; an analytic model is not
            caps = [slo.step_budget_cap((t for _, t in self._recent_ttft), self.steps_in_flight)]
            if tpots:  # a decode's next token waits for its step to cross every stage
                caps.append(min(tpots) / self.pp_size)
            # A step too short for a useful chunk of the longest prefill in flight pays the
            # per-chunk pass over the KV cache for little work and slows every request
            # (measured: long prompts 1.4-2.7x slower, TPOT worse). Such a cap cannot make the
            # SLO behind it attainable either, so it is dropped: the step keeps its plain CPP
            # length and that SLO acts through the order alone. (Flooring the cap at that
            # chunk instead left short requests meeting their SLO less often than plain CPP.)
            fixed = decode_cost + self.cost_model.step_overhead
            contexts = [r.num_computed_tokens for r in prefills if r.num_computed_tokens > 0]
            useful = MIN_USEFUL_CHUNK_BLOCKS * self.chunk_align
            floor = self.cost_model.chunk_cost(useful, max(contexts)) if contexts else 0.0
            cap = min((c - fixed for c in caps if c - fixed >= floor), default=math.inf)
        whole_below = cap if math.isfinite(cap) else 0.0  # no SLO in play: plain CPP chunks
        demands = [self._demand(r, whole_below) for r in prefills]
        self._publish_slo_ledger(demands)
        ordered = slo.order(demands, time.time(), step_s, self.pp_size, self.cpp_config.max_wait_s)
        budget = min(max(d.step_cost for d in demands), cap)
        allowances = slo.allocate(ordered, max(budget, 0.0))
        self._most_urgent = ordered[0].request_id
        # Decodes first, then prefills most urgent first; vLLM preempts from the back.
        rank = {d.request_id: i for i, d in enumerate(ordered)}
        self.running.sort(key=lambda r: rank.get(r.request_id, -1))
        if self.policy == SchedulingPolicy.FCFS and len(self.waiting) > 1:
            waiting = sorted(self.waiting, key=lambda r: rank.get(r.request_id, len(rank)))
            self.waiting.clear()
            self.waiting.extend(waiting)
        return allowances

    def _publish_slo_ledger(self, demands: list[slo.PrefillDemand]) -> None:
        if self.slo_ledger is None:
            return
        if self.cost_model.unit == "s":  # admission compares the backlog with SLOs in seconds
            self.slo_ledger.set_backlog(
                (d.request_id, d.arrival + d.ttft_s if d.ttft_s else None, d.remaining_cost)
                for d in demands
            )
        self.slo_ledger.publish()

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self.online is not None:
            for chunks, seconds in getattr(model_runner_output, STEP_TIMES_ATTR, None) or ():
                self.online.online.observe(chunks, seconds * self.rank_scale)
        if self.slo_ledger is not None:
            now, finished = time.time(), []
            for client_outputs in outputs.values():
                for output in client_outputs.outputs:
                    self.slo_ledger.on_tokens(output.request_id, len(output.new_token_ids), now)
                    if output.finish_reason is not None:
                        finished.append(output.request_id)
            self.slo_ledger.forget(finished)
            self.slo_ledger.drop_from_backlog(
                rid
                for rid in self.slo_ledger.backlog_ids
                if (r := self.requests.get(rid)) is None
                or r.num_computed_tokens >= r.num_prompt_tokens
            )
            self.slo_ledger.publish()
        return outputs

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> list[Request]:
        finished = super().finish_requests(request_ids, finished_status)
        if self.slo_ledger is not None and finished:  # aborts: not in the backlog any more
            self.slo_ledger.forget(r.request_id for r in finished)
            self.slo_ledger.publish()
        return finished

    def shutdown(self) -> None:
        if self.online is not None:
            self.online.close()
        if self.slo_ledger is not None:
            self.slo_ledger.remove_file()
        super().shutdown()

    def prefill_budget(self, request: Request, num_computed_tokens: int) -> float:
        """Per-step compute budget for this request's prefill, fixed when it is first scheduled."""
        budget = self._prefill_budgets.get(request.request_id)
        if budget is None:
            budget = prefill_budget(
                self.cost_model,
                request.num_tokens,
                self.pp_size,
                start=num_computed_tokens,
                block_size=self.chunk_align,
                min_chunk=self.cpp_config.min_chunk,
                num_steps=requested_num_steps(request) or self.cpp_config.num_steps,
                micro_chunks=self.cpp_config.micro_chunks,
            )
            self._prefill_budgets[request.request_id] = budget
        return budget

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(
            request, num_computed_tokens, num_new_tokens
        )
        remaining = request.num_tokens - num_computed_tokens
        if num_new_tokens == 0:
            return 0
        if remaining <= 1:  # a decode: charged, never cut
            self.last_step_cost += self.cost_model.chunk_cost(num_new_tokens, num_computed_tokens)
            return num_new_tokens
        if self._allowances is not None:
            return self._slo_chunk(request, num_computed_tokens, num_new_tokens)
        budget = self.prefill_budget(request, num_computed_tokens)
        first_prefill_of_step = self._step_budget_left is None
        if first_prefill_of_step:
            self._step_budget_left = budget * self._dither
        elif self._step_budget_left <= 0:
            # The first prefill took its smallest chunk over budget (at a long context one block
            # can cost more than the whole budget): the step is full.
            return 0
        planned = (
            self._planned_chunk(request, num_computed_tokens) if first_prefill_of_step else None
        )
        chunk = planned or next_chunk_size(
            self.cost_model,
            num_computed_tokens,
            remaining,
            self._step_budget_left,
            block_size=self.chunk_align,
            min_chunk=self.cpp_config.min_chunk,
        )
        chunk = min(chunk, num_new_tokens)
        cost = self.cost_model.chunk_cost(chunk, num_computed_tokens)
        if not first_prefill_of_step and cost > self._step_budget_left:
            # The step is full. Only its first prefill may exceed the budget (at the minimum chunk),
            # so that prefill always progresses; vLLM skips (running) or stops admitting (waiting).
            return 0
        if chunk == remaining:
            self._prefill_budgets.pop(request.request_id, None)
        self._step_budget_left -= cost
        self.last_step_cost += cost
        return chunk

    def _planned_chunk(self, request: Request, num_computed_tokens: int) -> int | None:
        """The next chunk of this prefill's rendezvous plan (None: equal-cost chunks for it).
        The plan is cut when the prefill first leads a step, and again whenever it resumes
        elsewhere than the plan goes on (a chunk vLLM cut short, a preemption)."""
        if not self.rendezvous or requested_num_steps(request) is not None:
            return None
        if self.online is not None and self.online.online.exploring:
            return None  # dithered equal-cost steps until the model has a scale in seconds
        rid = request.request_id
        position, chunks = self._handoff_plans.get(rid, (-1, deque()))
        if position != num_computed_tokens or not chunks:
            plan, _ = handoff.rendezvous_plan(
                self.cost_model, request.num_tokens, num_computed_tokens, self.chunk_align
            )
            position, chunks = num_computed_tokens, deque(plan)
        chunk = chunks.popleft()
        if chunks:
            self._handoff_plans[rid] = (position + chunk, chunks)
        else:
            self._handoff_plans.pop(rid, None)
        return chunk

    def _slo_chunk(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        """The prefill chunk within this request's allowance of the step (0: it waits)."""
        allowance = self._allowances.get(request.request_id)
        if allowance is None:
            return 0
        remaining = request.num_tokens - num_computed_tokens
        chunk = next_chunk_size(
            self.cost_model,
            num_computed_tokens,
            remaining,
            allowance,
            self.chunk_align,
            self.cpp_config.min_chunk,
        )
        chunk = min(chunk, num_new_tokens)
        cost = self.cost_model.chunk_cost(chunk, num_computed_tokens)
        if cost > allowance * (1 + 1e-9) and request.request_id != self._most_urgent:
            return 0  # its smallest chunk does not fit; the most urgent always progresses
        if chunk == remaining:
            self._prefill_budgets.pop(request.request_id, None)
        self.last_step_cost += cost
        return chunk
