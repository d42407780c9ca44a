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
fits what is left of B. Decodes are charged but never cut. Everything else - KV allocation, prefix
caching, preemption, aborts - is vLLM's own scheduler, reached through one hook,
`_reserve_prefill_lookahead`, which vLLM calls for every request it is about to schedule.
"""

from __future__ import annotations

import math

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from vllm_omni.cpp.chunking import budget_for_steps, next_chunk_size, optimal_num_steps
from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.cost_model_source import resolve_cost_model
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

NUM_STEPS_ARG = "cpp_num_steps"
"""Per-request override of CPPConfig.num_steps in SamplingParams.extra_args (OpenAI: vllm_xargs)."""


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
        self.cost_model: CostModel = resolve_cost_model(self.cpp_config, self.vllm_config)
        self._prefill_budgets: dict[str, float] = {}
        self._step_budget_left: float | None = None
        self.last_step_cost = 0.0
        logger.info(
            "CPP scheduler: pp=%d, cost model %s, num_steps=%s, min_chunk=%d",
            self.pp_size,
            self.cost_model,
            self.cpp_config.num_steps or "auto",
            self.cpp_config.min_chunk,
        )

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        # The first prefill a step meets sets the step's budget (see _reserve_prefill_lookahead).
        self._step_budget_left = None
        self.last_step_cost = self.cost_model.step_overhead
        if len(self._prefill_budgets) > len(self.requests) + 64:
            self._prefill_budgets = {
                rid: b for rid, b in self._prefill_budgets.items() if rid in self.requests
            }
        return super().schedule(throttle_prefills)

    def prefill_budget(self, request: Request, num_computed_tokens: int) -> float:
        """Per-step compute budget for this request's prefill, fixed when it is first scheduled."""
        budget = self._prefill_budgets.get(request.request_id)
        if budget is None:
            remaining = request.num_tokens - num_computed_tokens
            total = self.cost_model.chunk_cost(remaining, num_computed_tokens)
            num_steps = requested_num_steps(request) or self.cpp_config.num_steps
            if num_steps is None:
                # Each extra step pays the fixed step cost and one more pass over the context
                # (on average about half way through this prefill).
                per_step = self.cost_model.step_overhead + self.cost_model.context * (
                    num_computed_tokens + remaining / 2
                )
                num_steps = optimal_num_steps(
                    total,
                    per_step,
                    self.pp_size,
                    max_steps=max(1, math.ceil(remaining / self.chunk_align)),
                )
            budget = budget_for_steps(
                self.cost_model,
                request.num_tokens,
                num_steps,
                start=num_computed_tokens,
                block_size=self.chunk_align,
                min_chunk=self.cpp_config.min_chunk,
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
        budget = self.prefill_budget(request, num_computed_tokens)
        first_prefill_of_step = self._step_budget_left is None
        if first_prefill_of_step:
            self._step_budget_left = budget
        chunk = next_chunk_size(
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
