# SPDX-License-Identifier: Apache-2.0
"""PP=2 on vLLM's CPU backend works out of the box and matches PP=1 token for token.

Stock vLLM 0.32 fails here at start-up (thread binding, memory) and, with enforce_eager, on the
first step; vllm_omni's plugin fixes both (vllm_omni/_patches.py). Prompts longer than the token
budget make vLLM stream prefill chunks of one request through both stages.
"""

import gc
import random

import pytest

pytestmark = pytest.mark.engine

MAX_TOKENS = 16
ENGINE_ARGS = dict(dtype="float32", max_model_len=4096, max_num_batched_tokens=512, seed=0)


def _prompts(vocab_size: int) -> list[dict]:
    rng = random.Random(0)
    lengths = [5, 37, 700, 1500]
    return [{"prompt_token_ids": [rng.randrange(3, vocab_size) for _ in range(n)]} for n in lengths]


def _greedy_tokens(model, **engine_args) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), **ENGINE_ARGS, **engine_args)
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    outputs = llm.generate(
        _prompts(vocab_size), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    )
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def pp1_tokens(tiny_models):
    return _greedy_tokens(tiny_models["llama-8l"], pipeline_parallel_size=1, enforce_eager=True)


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "compiled"])
def test_pp2_matches_pp1(tiny_models, pp1_tokens, enforce_eager):
    pp2_tokens = _greedy_tokens(
        tiny_models["llama-8l"], pipeline_parallel_size=2, enforce_eager=enforce_eager
    )
    assert all(len(t) == MAX_TOKENS for t in pp1_tokens)
    assert pp2_tokens == pp1_tokens
