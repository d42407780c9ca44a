# SPDX-License-Identifier: Apache-2.0
"""CPP gives the same greedy tokens as plain vLLM, through real engines.

Reference: plain vLLM at PP=1. CPP runs at PP=2 with prefix caching on and off, at PP=4 (the
design's `vllm serve --omni -pp 4 --cpp`, through the Python API and the server), and with a KV
cache so small that requests are preempted mid-prefill and recomputed. Float32 and eager, so that
only the chunking differs (CPP cuts prompts at other places than vLLM's fixed chunks).
"""

import re

import pytest

from tests.greedy_reference import LONG_LENGTHS, MAX_MODEL_LEN, MAX_TOKENS
from tests.greedy_reference import run_engine as _run
from vllm_omni.cpp import cpp_engine_args

pytestmark = pytest.mark.engine

# The 16K prompt runs in one CPP configuration; the others stop at 4K (SHORTER); PP=4 adds 8K.
SHORTER = 2


@pytest.fixture(scope="module")
def prompts(greedy_prompts):
    return greedy_prompts


@pytest.fixture(scope="module")
def reference(greedy_reference):
    return greedy_reference


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_cpp_pp2_matches_plain_pp1(tiny_models, prompts, reference, prefix_caching):
    args = cpp_engine_args(
        pipeline_parallel_size=2, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=prefix_caching
    )
    num_long = len(LONG_LENGTHS) if not prefix_caching else SHORTER
    sets = {"long": prompts["long"][:num_long], "prefix": prompts["prefix"]}
    got = _run(tiny_models["llama-8l"], sets, **args)
    assert got["long"] == reference["long"][:num_long]
    assert got["prefix"] == reference["prefix"]


def test_cpp_under_preemption_matches_plain(tiny_models, prompts, reference):
    # Room for ~5K tokens per stage while four ~3K-token prompts run at once: vLLM preempts.
    args = cpp_engine_args(
        {"num_steps": 6},
        pipeline_parallel_size=2,
        max_model_len=3200,
        kv_cache_memory_bytes=5000 * 4 * 2 * 2 * 64 * 4,
        enable_prefix_caching=False,
    )
    got = _run(tiny_models["llama-8l"], {"preempt": prompts["preempt"]}, **args)
    assert got["num_preemptions"] > 0
    assert got["preempt"] == reference["preempt"]


def test_cpp_micro_chunks_match_plain_pp1(tiny_models, prompts, reference):
    # RFC phase 2: the workers split each step's chunk in three; tokens stay those of PP=1.
    args = cpp_engine_args(
        {"micro_chunks": 3},
        pipeline_parallel_size=2,
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=True,
    )
    sets = {"long": prompts["long"][:SHORTER], "prefix": prompts["prefix"]}
    got = _run(tiny_models["llama-8l"], sets, **args)
    assert got["long"] == reference["long"][:SHORTER]
    assert got["prefix"] == reference["prefix"]
    pieces = got["step_records"]
    assert any(r["pieces"] == 3 for r in pieces[0]), "no step was split into micro-chunks"
    # Every rank ran the same pieces, in the same order.
    assert [r["chunks"] for r in pieces[0]] == [r["chunks"] for r in pieces[1]]


# PP=4: two layers of the 8-layer model per stage, four ranks on this 2-core machine (slower, not
# wrong: every rank computes its own layers whatever the cores). The Python API without prefix
# caching, up to 8K tokens; the server below with it (vLLM's default) and the prefix prompts.
def test_cpp_pp4_matches_plain_pp1(tiny_models, prompts, reference):
    args = cpp_engine_args(
        pipeline_parallel_size=4, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=False
    )
    sets = {"long": prompts["long"][:SHORTER], "8k": prompts["8k"]}
    got = _run(tiny_models["llama-8l"], sets, **args)
    assert got["long"] == reference["long"][:SHORTER]
    assert got["8k"] == reference["8k"]
    ranks = got["step_records"]
    assert len(ranks) == 4
    # Every stage ran every step, and CPP cut the 8K prompt into more than one chunk.
    assert len({len(r) for r in ranks}) == 1
    assert [r["chunks"] for r in ranks[0]] == [r["chunks"] for r in ranks[3]]
    assert max(x for r in ranks[0] for x, _ in r["chunks"]) < len(prompts["8k"][0])


def test_serve_omni_pp4_cpp_matches_plain_pp1(tiny_models, prompts, reference):
    import openai
    import requests

    from tests.server import BIN, ServerProcess

    model = str(tiny_models["llama-8l"])
    command = [str(BIN / "vllm"), "serve", model, "--omni", "--pipeline-parallel-size", "4"]
    command += ["--cpp", "--dtype", "float32", "--enforce-eager", "--seed", "0"]
    command += ["--max-model-len", str(MAX_MODEL_LEN)]
    with ServerProcess(command, timeout_s=600) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        sets = {"long": prompts["long"][:SHORTER], "prefix": prompts["prefix"]}
        for name, token_prompts in sets.items():
            for i, prompt in enumerate(token_prompts):
                completion = client.completions.create(
                    model=model,
                    prompt=prompt,
                    max_tokens=MAX_TOKENS,
                    temperature=0.0,
                    extra_body={"min_tokens": MAX_TOKENS, "return_token_ids": True},
                )
                assert getattr(completion.choices[0], "token_ids") == reference[name][i], (name, i)
        metrics = requests.get(f"{server.url}/metrics", timeout=30).text
    hits = re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", metrics, re.MULTILINE)
    assert hits and float(hits[0]) >= 2048, (
        "prefix caching was off: the prompts sharing 3000 tokens"
    )
