# SPDX-License-Identifier: Apache-2.0
"""CPP gives the same greedy tokens as plain vLLM, through real engines.

Reference: plain vLLM at PP=1. CPP runs at PP=2 with prefix caching on (and the workers splitting
steps into micro-chunks) and off (from an empty cost-model cache, fitting its model online as it
goes), at PP=4 (the design's `vllm serve --omni -pp 4 --cpp`, through the server), and with
a KV cache so small that requests are preempted mid-prefill and recomputed.
Float32 and eager, so that only the chunking differs (CPP cuts prompts at other places than
vLLM's fixed chunks). Each configuration is one engine start (30-50 s here): a test checks all
that its engine can show.
"""

import json
import re

import pytest

from tests.helpers.greedy_reference import LONG_LENGTHS, MAX_MODEL_LEN, MAX_TOKENS
from tests.helpers.greedy_reference import run_engine as _run
from vllm_omni.cpp import cpp_engine_args, online_fit

pytestmark = pytest.mark.engine

# The 8K prompt runs in the configurations without prefix caching; the others stop at 4K.
SHORTER = 2


@pytest.fixture(scope="module")
def prompts(greedy_prompts):
    return greedy_prompts


@pytest.fixture(scope="module")
def reference(greedy_reference):
    return greedy_reference


def test_cpp_pp2_prefix_cache_and_micro_chunks_match_plain_pp1(tiny_models, prompts, reference):
    # RFC phase 2: the workers split each step's chunk in three; tokens stay those of PP=1,
    # prefix-cache hits included.
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


def _online_model_adopted(llm) -> dict:
    """Short requests until the scheduler plans with its online fit (the fit runs on a thread;
    the next steps adopt it); the cost-model lines of /metrics then."""
    from prometheus_client import REGISTRY, generate_latest
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=2)
    for _ in range(20):
        metrics = generate_latest(REGISTRY).decode()
        if 'source="online"' in metrics:
            break
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)
    return {"metrics": [line for line in metrics.splitlines() if "cpp_cost_model" in line]}


def test_cpp_pp2_no_prefix_cache_fits_online_and_matches_plain_pp1(
    tiny_models, prompts, reference, tmp_path, monkeypatch
):
    """From an empty cost-model cache: the analytic model plans first, the last rank's step
    times reach the scheduler through vLLM's multiprocessing executor, the fit is adopted while
    the prompts run, shown on /metrics and saved where the next engine looks; the tokens stay
    plain vLLM's throughout."""
    from vllm_omni.cpp.cost_model_source import calibration_dir
    from vllm_omni.platform.cache_dir import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # this test's own, empty
    args = cpp_engine_args(
        pipeline_parallel_size=2, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=False
    )
    sets = {"long": prompts["long"], "prefix": prompts["prefix"]}
    got = _run(tiny_models["llama-8l"], sets, _online_model_adopted, **args)
    assert len(got["long"]) == len(LONG_LENGTHS) and got["long"] == reference["long"]
    assert got["prefix"] == reference["prefix"]

    assert 'vllm_omni:cpp_cost_model_info{source="online",unit="s"} 1.0' in got["metrics"]
    assert any("vllm_omni:cpp_cost_model_fit_relative_rmse" in m for m in got["metrics"])
    saved = list(calibration_dir().glob("*.json"))
    assert len(saved) == 1
    data = json.loads(saved[0].read_text())
    assert data["unit"] == "s" and data["fit"]["source"] == "online"
    assert data["fit"]["num_steps"] >= online_fit.MIN_FIT_STEPS
    assert data["fit"]["rel_rmse"] < online_fit.MAX_ADOPT_RMSE


def test_cpp_under_preemption_matches_plain(tiny_models, prompts, reference, monkeypatch):
    # Room for ~5K tokens per stage while four ~3K-token prompts run at once: vLLM preempts.
    # (The tests' VLLM_CPU_KVCACHE_SPACE would override this size: tests/conftest.py.)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
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


# PP=4: two layers of the 8-layer model per stage, four ranks on this 2-core machine (slower, not
# wrong: every rank computes its own layers whatever the cores). One engine, through the server
# (the design's `vllm serve --omni -pp 4 --cpp`) with prefix caching on (vLLM's default): 1K and
# 8K tokens, then the prompts that share a prefix; the ranks' step records through vLLM's
# development RPC route.
def test_serve_omni_pp4_cpp_matches_plain_pp1(tiny_models, prompts, reference):
    import openai
    import requests

    from tests.helpers.server import BIN, ServerProcess, greedy_token_ids

    model = str(tiny_models["llama-8l"])
    command = [str(BIN / "vllm"), "serve", model, "--omni", "--pipeline-parallel-size", "4"]
    command += ["--cpp", "--dtype", "float32", "--enforce-eager", "--seed", "0"]
    command += ["--max-model-len", str(MAX_MODEL_LEN)]
    ends = [0, -1]  # 1K and 8K tokens
    sets = {"long": [prompts["long"][i] for i in ends], "prefix": prompts["prefix"]}
    expected = {"long": [reference["long"][i] for i in ends], "prefix": reference["prefix"]}
    with ServerProcess(command, env={"VLLM_SERVER_DEV_MODE": "1"}, timeout_s=600) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        for name, token_prompts in sets.items():
            for i, prompt in enumerate(token_prompts):
                got = greedy_token_ids(client, model, prompt, MAX_TOKENS)
                assert got == expected[name][i], (name, i)
        metrics = requests.get(f"{server.url}/metrics", timeout=30).text
        rpc = {"method": "cpp_take_step_records"}
        ranks = requests.post(f"{server.url}/collective_rpc", json=rpc, timeout=60).json()
    hits = re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", metrics, re.MULTILINE)
    assert hits and float(hits[0]) >= 2048, (
        "prefix caching was off: the prompts sharing 3000 tokens"
    )
    ranks = ranks["results"]
    assert len(ranks) == 4
    # Every stage ran every step, and CPP cut the 8K prompt into more than one chunk.
    assert len({len(r) for r in ranks}) == 1
    assert [r["chunks"] for r in ranks[0]] == [r["chunks"] for r in ranks[3]]
    assert max(x for r in ranks[0] for x, _ in r["chunks"]) < len(sets["long"][1])
