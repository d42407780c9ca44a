# SPDX-License-Identifier: Apache-2.0
"""`--cpp` flags: translated into vLLM engine arguments, bad combinations named clearly."""

import argparse

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
    args = parse("--cpp", "-pp", "2", "--cpp-num-steps", "12", "--additional-config", '{"x": 1}')
    apply_cpp_args(args)
    assert args.scheduler_cls == "vllm_omni.cpp.scheduler.CPPScheduler"
    assert args.worker_cls.startswith("vllm_omni.cpp.worker.CPP")
    assert args.additional_config["x"] == 1
    assert CPPConfig.from_dict(args.additional_config["cpp"]) == CPPConfig(num_steps=12)
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


@pytest.mark.engine
def test_serve_with_cpp_answers_long_prompts(tiny_models):
    import openai

    from tests.server import BIN, ServerProcess

    model = str(tiny_models["llama-8l"])
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
    ]
    with ServerProcess(command) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
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
            extra_body={"vllm_xargs": {"ttft_slo_ms": 500, "tpot_slo_ms": 100}},
        )
        assert completion.usage.completion_tokens >= 1
        with pytest.raises(openai.BadRequestError, match="ttft_slo_ms"):
            client.completions.create(
                model=model,
                prompt="hello",
                max_tokens=2,
                extra_body={"vllm_xargs": {"ttft_slo_ms": -1}},
            )
        log = server.log_text()
    assert "CPP scheduler: pp=2" in log
