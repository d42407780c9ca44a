# SPDX-License-Identifier: Apache-2.0
"""Splitting one scheduled prefill chunk into micro-chunks (RFC phase 2), without an engine.
tests/cpp/test_cpp_engine.py runs it through real engines against plain vLLM's tokens."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
from vllm import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

from vllm_omni.cpp import micro_chunks
from vllm_omni.cpp.cost_model import CostModel

MODEL = CostModel(linear=1.0, attention=0.01, step_overhead=5.0, unit="s")


def new_request_step(prompt_len: int, cached: int, chunk: int, **params) -> SchedulerOutput:
    request = NewRequestData(
        req_id="r",
        prompt_token_ids=list(range(prompt_len)),
        mm_features=[],
        sampling_params=SamplingParams(**params),
        pooling_params=None,
        block_ids=([1, 2, 3],),
        num_computed_tokens=cached,
        lora_request=None,
    )
    step = SchedulerOutput.make_empty()
    return replace(
        step,
        scheduled_new_reqs=[request],
        num_scheduled_tokens={"r": chunk},
        total_num_scheduled_tokens=chunk,
        finished_req_ids={"done"},
    )


def cached_request_step(cached: int, chunk: int, num_output_tokens: int = 0) -> SchedulerOutput:
    data = CachedRequestData(
        req_ids=["r"],
        resumed_req_ids=set(),
        new_token_ids=[],
        all_token_ids={},
        new_block_ids=[([4],)],
        num_computed_tokens=[cached],
        num_output_tokens=[num_output_tokens],
    )
    step = SchedulerOutput.make_empty()
    return replace(
        step,
        scheduled_cached_reqs=data,
        num_scheduled_tokens={"r": chunk},
        total_num_scheduled_tokens=chunk,
    )


RUNNER_REQUESTS = {
    "r": SimpleNamespace(prompt_token_ids=list(range(4096)), sampling_params=SamplingParams())
}


def test_lone_prefill_accepts_prompt_chunks_only():
    assert micro_chunks.lone_prefill(new_request_step(4096, 0, 1024), {}) == ("r", 0, 1024)
    assert micro_chunks.lone_prefill(cached_request_step(1024, 2048), RUNNER_REQUESTS) == (
        "r",
        1024,
        2048,
    )
    # A decode (output tokens), prompt logprobs, or a chunk past the prompt stay whole.
    assert micro_chunks.lone_prefill(cached_request_step(4096, 1, 1), RUNNER_REQUESTS) is None
    assert micro_chunks.lone_prefill(new_request_step(4096, 0, 1024, prompt_logprobs=1), {}) is None
    assert micro_chunks.lone_prefill(new_request_step(1000, 0, 1024), {}) is None
    # Two requests in one step stay whole.
    two = new_request_step(4096, 0, 1024)
    two = replace(two, num_scheduled_tokens={"r": 1024, "s": 1}, total_num_scheduled_tokens=1025)
    assert micro_chunks.lone_prefill(two, {}) is None


def test_piece_sizes_balance_cost_on_aligned_cuts():
    sizes = micro_chunks.piece_sizes(MODEL, 1024, 2048, 4, 64)
    assert sum(sizes) == 2048 and 2 <= len(sizes) <= 4
    assert all(s % 64 == 0 for s in sizes[:-1])
    costs, pos = [], 1024
    for s in sizes:
        costs.append(MODEL.chunk_cost(s, pos))
        pos += s
    assert max(costs) / min(costs) < 1.5
    assert sizes == sorted(sizes, reverse=True)  # later pieces see more context


def test_split_carries_the_step_once_then_advances_the_request():
    step = new_request_step(4096, 0, 1536)
    pieces = micro_chunks.split(step, "r", 0, [768, 512, 256])
    assert [p.total_num_scheduled_tokens for p in pieces] == [768, 512, 256]
    assert [p.num_scheduled_tokens for p in pieces] == [{"r": 768}, {"r": 512}, {"r": 256}]
    first, *rest = pieces
    assert first.scheduled_new_reqs == step.scheduled_new_reqs
    assert first.finished_req_ids == {"done"}
    for piece, computed in zip(rest, (768, 1280)):
        assert piece.scheduled_new_reqs == []
        assert piece.finished_req_ids == set()
        data = piece.scheduled_cached_reqs
        assert data.req_ids == ["r"] and data.num_computed_tokens == [computed]
        assert data.new_block_ids == [None]  # blocks came with the first piece
        assert data.num_output_tokens == [0]
    # The original step is left as it was.
    assert step.total_num_scheduled_tokens == 1536


@pytest.mark.parametrize("bad", [0, 65, True, 1.5])
def test_micro_chunks_option_is_validated(bad):
    from vllm_omni.cpp.config import CPPConfig

    with pytest.raises(ValueError, match="cpp.micro_chunks"):
        CPPConfig(micro_chunks=bad)


def test_micro_chunks_need_pipeline_parallelism():
    from vllm_omni.cpp import cpp_engine_args

    with pytest.raises(ValueError, match="cpp.micro_chunks needs pipeline_parallel_size > 1"):
        cpp_engine_args({"micro_chunks": 2}, pipeline_parallel_size=1)
