# SPDX-License-Identifier: Apache-2.0
"""`--cpp` flags: translated into vLLM engine arguments, bad combinations named clearly."""

import argparse
import json
import re
import threading
import time

import pytest
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from vllm_omni.cpp import cpp_engine_args
from vllm_omni.cpp.cli import add_cpp_args, apply_cpp_args
from vllm_omni.cpp.config import CPPConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = make_arg_parser(FlexibleArgumentParser())
    add_cpp_args(parser)
    return parser.parse_args(["--model", "m", *argv])


def test_cpp_flags_become_engine_args():
    args = parse(
        "--cpp", "-pp", "2", "--cpp-num-steps", "12", "--cpp-micro-chunks", "2",
        "--additional-config", '{"x": 1}',
    )  # fmt: skip
    apply_cpp_args(args)
    assert args.scheduler_cls == "vllm_omni.cpp.scheduler.CPPScheduler"
    assert args.worker_cls.startswith("vllm_omni.cpp.worker.CPP")
    assert args.additional_config["x"] == 1
    assert CPPConfig.from_dict(args.additional_config["cpp"]) == CPPConfig(
        num_steps=12, micro_chunks=2
    )
    assert args.max_num_batched_tokens == 8192 and args.enable_chunked_prefill


def test_user_token_budget_is_kept():
    args = parse("--cpp", "-pp", "2", "--max-num-batched-tokens", "4096")
    apply_cpp_args(args)
    assert args.max_num_batched_tokens == 4096


def test_plain_serve_is_untouched():
    args = parse("-pp", "2")
    apply_cpp_args(args)
    assert args.scheduler_cls is None and args.additional_config == {}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cpp-num-steps", "4"], "--cpp-num-steps needs --cpp"),
        (["--cpp", "-pp", "2", "--no-enable-chunked-prefill"], "needs chunked prefill"),
        (["--cpp", "--cpp-num-steps", "4"], "needs pipeline_parallel_size > 1"),
        (["--cpp", "--cpp-micro-chunks", "2"], "cpp.micro_chunks needs pipeline_parallel_size > 1"),
        (["--cpp", "-pp", "2", "--cpp-micro-chunks", "0"], "cpp.micro_chunks must be"),
        (["--cpp", "-pp", "2", "--cpp-min-chunk", "-1"], "cpp.min_chunk"),
        (["--cpp", "-pp", "2", "--scheduler-cls", "my.Scheduler"], "scheduler_cls is set by CPP"),
    ],
)
def test_bad_combinations_name_the_problem(argv, message):
    with pytest.raises(ValueError, match=message):
        apply_cpp_args(parse(*argv))


def test_python_api_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown CPP option cpp.chunk"):
        cpp_engine_args({"chunk": 5}, pipeline_parallel_size=2)
    assert (
        cpp_engine_args(pipeline_parallel_size=2, max_num_batched_tokens=1024)[
            "max_num_batched_tokens"
        ]
        == 1024
    )


SLOW_COST_MODEL = {"linear": 2e-3, "attention": 0.0, "context": 0.0, "step_overhead": 0.05}
"""A calibrated-looking cost model (seconds) that makes every prefill look slow: with it the
scheduler's backlog is large whatever the machine, so admission control has work to refuse."""


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


@pytest.mark.engine
def test_serve_with_cpp_answers_long_prompts(tiny_models, tmp_path):
    import openai
    import requests

    from tests.server import BIN, ServerProcess

    model = str(tiny_models["llama-8l"])
    cost_model = tmp_path / "cost.json"
    cost_model.write_text(json.dumps({**SLOW_COST_MODEL, "unit": "s"}))
    command = [
        str(BIN / "vllm-omni"),
        "serve",
        model,
        "--cpp",
        "-pp",
        "2",
        "--max-model-len",
        "8192",
        "--cpp-slo",
        "--cpp-slo-admission",
        "--cpp-cost-model",
        str(cost_model),
    ]
    with ServerProcess(command) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        prompt = [(i * 7919) % 2000 + 3 for i in range(6000)]
        completion = client.completions.create(
            model=model, prompt=prompt, max_tokens=4, extra_body={"min_tokens": 4}
        )
        assert completion.usage.prompt_tokens == 6000
        assert completion.usage.completion_tokens == 4
        # SLO-aware scheduling: per-request SLOs through vllm_xargs; bad ones are a 400.
        completion = client.completions.create(
            model=model,
            prompt="hello",
            max_tokens=2,
            extra_body={"min_tokens": 2, "vllm_xargs": {"ttft_slo_ms": 500, "tpot_slo_ms": 100}},
        )
        assert completion.usage.completion_tokens == 2
        with pytest.raises(openai.BadRequestError, match="ttft_slo_ms"):
            client.completions.create(
                model=model,
                prompt="hello",
                max_tokens=2,
                extra_body={"vllm_xargs": {"ttft_slo_ms": -1}},
            )

        # Admission control: while a long prompt with an earlier deadline prefills (12 s of
        # work to the cost model), a request with a 1.5 s TTFT SLO is refused with a 429.
        def metrics() -> str:
            return requests.get(f"{server.url}/metrics", timeout=10).text

        long = threading.Thread(
            target=client.completions.create,
            kwargs=dict(
                model=model,
                prompt=[(i * 7919) % 2000 + 3 for i in range(7000)],
                max_tokens=1,
                extra_body={"vllm_xargs": {"ttft_slo_ms": 1000}},
            ),
        )
        long.start()
        deadline = time.monotonic() + 60
        while _metric(metrics(), "vllm_omni:slo_prefill_backlog_seconds") < 3:
            assert time.monotonic() < deadline, "the long prompt never showed in the backlog"
            time.sleep(0.02)
        with pytest.raises(openai.RateLimitError, match="ttft_slo_ms"):
            client.completions.create(
                model=model,
                prompt="hi",
                max_tokens=1,
                extra_body={"vllm_xargs": {"ttft_slo_ms": 1500}},
            )
        long.join(timeout=120)
        client.completions.create(model=model, prompt="hi", max_tokens=1)  # the server is fine
        deadline = time.monotonic() + 10
        while (text := metrics()) and _metric(text, "vllm_omni:slo_prefill_backlog_seconds") > 0:
            assert time.monotonic() < deadline, "the backlog never drained"
            time.sleep(0.2)
        # SLO outcomes: "hello" and the long prompt had TTFT SLOs, "hello" one 100 ms step.
        ttft = sum(
            _metric(text, f'vllm_omni:slo_ttft_total{{outcome="{o}"}}') for o in ("met", "missed")
        )
        tpot = sum(
            _metric(text, f'vllm_omni:slo_tpot_total{{outcome="{o}"}}') for o in ("met", "missed")
        )
        assert (ttft, tpot) == (2, 1)
        assert _metric(text, 'vllm_omni:slo_ttft_slack_seconds_bucket{le="+Inf"}') == 2
        assert _metric(text, "vllm_omni:slo_admission_rejected_total") == 1
        log = server.log_text()
    assert "CPP scheduler: pp=2" in log
