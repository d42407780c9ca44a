# SPDX-License-Identifier: Apache-2.0
"""PP=2 on vLLM's CPU backend works out of the box and gives the same greedy tokens as PP=1.

Stock vLLM 0.32 fails here at start-up (thread binding, memory) and, with enforce_eager, on the
first step; vllm_omni's plugin fixes both (vllm_omni/_patches.py). Prompts longer than the token
budget make vLLM stream prefill chunks of one request through both stages. Compiled, as a user
runs it: eager PP=2 runs in every CPP engine test (tests/cpp/test_cpp_engine.py, on the same CPU
model runner and the same patch), so a second plain engine here would buy 50 s of nothing new.

The PP=1 side is transformers' greedy decode in float32: tests/models/test_tiny.py shows vLLM at
PP=1 gives the same tokens as transformers, so PP=2 equal to transformers is PP=2 equal to PP=1,
without a third engine start (30-40 s here). The reference's top-1/top-2 logit gaps are checked,
so no near-tie can decide the comparison.
"""

import gc
import os
import random

import pytest
import torch

from ..helpers.hf_reference import MIN_LOGIT_GAP, greedy_with_gap

pytestmark = pytest.mark.engine

MAX_TOKENS = 16
ENGINE_ARGS = dict(dtype="float32", max_model_len=4096, max_num_batched_tokens=512, seed=0)


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(0)
    lengths = [5, 37, 700, 1500]
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def _vllm_greedy(model, **engine_args) -> tuple[list[list[int]], set[str]]:
    """The greedy tokens, and the /dev/shm names that were there while the engine ran."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), **ENGINE_ARGS, **engine_args)
    prompts = _prompts(llm.llm_engine.model_config.get_vocab_size())
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    shm_running = set(os.listdir("/dev/shm"))
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs], shm_running


@pytest.fixture(scope="module")
def reference(tiny_models) -> tuple[list[list[int]], float]:
    """transformers' greedy tokens in float32, and the smallest top-1/top-2 logit gap."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama-8l"], dtype=torch.float32)
    return greedy_with_gap(model, _prompts(model.config.vocab_size), MAX_TOKENS)


def test_pp2_matches_pp1(tiny_models, reference):
    expected, min_gap = reference
    assert min_gap > MIN_LOGIT_GAP  # no near-ties: a correct kernel cannot flip a token
    shm_before = set(os.listdir("/dev/shm"))
    pp2_tokens, shm_running = _vllm_greedy(tiny_models["llama-8l"], pipeline_parallel_size=2)
    assert all(len(t) == MAX_TOKENS for t in expected)
    assert pp2_tokens == expected
    # The PP group's shared memory is unlinked once both ranks mapped it (_patches, patch 7),
    # so nothing is left however the workers end.
    assert not [name for name in shm_running - shm_before if "cpushm" in name]
    assert set(os.listdir("/dev/shm")) - shm_before == set()
