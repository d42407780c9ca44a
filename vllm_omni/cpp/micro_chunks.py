# SPDX-License-Identifier: Apache-2.0
"""The RFC's phase 2: one scheduled prefill chunk split in the worker into micro-chunks.

With `cpp.micro_chunks = k` the scheduler plans 1/k as many steps, and every PP rank's worker
cuts a step that holds one long prefill chunk alone into k pieces of equal cost (the CPP cost
model, cuts on `chunk_align` token boundaries). Each piece is an ordinary SchedulerOutput for the
model runner: the first carries everything the step brings (new request data, block ids, finished
requests); the later ones name the request as cached, with its computed tokens advanced by the
pieces before. Rank r runs piece i as soon as rank r-1 has sent it, so the pieces stream
through the pipeline inside one scheduler step, and the engine sees one step and one output.

Steps the model runner would treat differently piece by piece are left whole: several requests,
a decode, speculative tokens, structured output, prompt logprobs, KV or encoder connectors,
multimodal inputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.output import CachedRequestData

from vllm_omni.cpp.chunking import budget_for_steps, plan_chunks
from vllm_omni.cpp.cost_model import CostModel

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


def lone_prefill(scheduler_output: SchedulerOutput, runner_requests: dict[str, Any]):
    """(request id, cached tokens, chunk tokens) when the step is one prompt chunk alone and
    nothing in it needs the whole step at once; else None."""
    so = scheduler_output
    if len(so.num_scheduled_tokens) != 1 or so.scheduled_spec_decode_tokens:
        return None
    if so.has_structured_output_requests or so.scheduled_encoder_inputs:
        return None
    if so.kv_connector_metadata is not None or so.ec_connector_metadata is not None:
        return None
    ((req_id, num_tokens),) = so.num_scheduled_tokens.items()
    if so.scheduled_new_reqs:
        new = so.scheduled_new_reqs[0]
        if new.mm_features:
            return None
        params, prompt_len = new.sampling_params, len(new.prompt_token_ids or ())
        cached = new.num_computed_tokens
    else:
        data = so.scheduled_cached_reqs
        if data.req_ids != [req_id] or data.num_output_tokens[0] != 0 or data.resumed_req_ids:
            return None
        state = runner_requests.get(req_id)
        if state is None:
            return None
        params, prompt_len = state.sampling_params, len(state.prompt_token_ids or ())
        cached = data.num_computed_tokens[0]
    if params is None or params.prompt_logprobs is not None:
        return None
    if cached + num_tokens > prompt_len:  # not (only) prompt tokens
        return None
    return req_id, cached, num_tokens


def piece_sizes(
    cost_model: CostModel, cached: int, num_tokens: int, pieces: int, align: int
) -> list[int]:
    """At most `pieces` equal-cost sizes covering num_tokens after `cached` tokens."""
    end = cached + num_tokens
    budget = budget_for_steps(cost_model, end, pieces, start=cached, block_size=align)
    return plan_chunks(end, cost_model, budget, block_size=align, start=cached)


def split(scheduler_output: SchedulerOutput, req_id: str, cached: int, sizes: list[int]) -> list:
    """One SchedulerOutput per piece of request `req_id`'s chunk (`sizes` in order), which
    starts after `cached` computed tokens."""
    so = scheduler_output
    pieces = [
        replace(so, num_scheduled_tokens={req_id: sizes[0]}, total_num_scheduled_tokens=sizes[0])
    ]
    computed = cached + sizes[0]
    for size in sizes[1:]:
        data = CachedRequestData(
            req_ids=[req_id],
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[None],
            num_computed_tokens=[computed],
            num_output_tokens=[0],
        )
        pieces.append(
            replace(
                so,
                scheduled_new_reqs=[],
                scheduled_cached_reqs=data,
                num_scheduled_tokens={req_id: size},
                total_num_scheduled_tokens=size,
                finished_req_ids=set(),
                free_encoder_mm_hashes=[],
                preempted_req_ids=None,
                new_block_ids_to_zero=None,
                kv_cache_block_copies=None,
            )
        )
        computed += size
    return pieces
