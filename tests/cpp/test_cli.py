# SPDX-License-Identifier: Apache-2.0
"""`--cpp` flags: translated into vLLM engine arguments, bad combinations named clearly."""

import argparse
import json
import math
import re
import threading
import time
from collections import Counter

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
    assert args.worker_cls.startswith("vllm_omni.worker.omni_worker.Omni")
    assert args.additional_config["omni_worker_hooks"] == ["cpp"]
    assert args.additional_config["x"] == 1
    config = CPPConfig.from_dict(args.additional_config["cpp"])
    assert config.status_path  # where the scheduler tells /metrics about its cost model
    assert config == CPPConfig(num_steps=12, micro_chunks=2, status_path=config.status_path)
    assert config.online_calibration
    args = parse("--cpp", "-pp", "2", "--no-cpp-online-calibration")
    apply_cpp_args(args)
    assert args.additional_config["cpp"]["online_calibration"] is False
    assert args.max_num_batched_tokens == 8192 and args.enable_chunked_prefill
    args = parse("--cpp", "-pp", "2", "--cpp-handoff", "rendezvous")
    apply_cpp_args(args)
    assert args.additional_config["cpp"]["handoff"] == "rendezvous"


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


@pytest.fixture(scope="module")
def cpp_server(tiny_models, tmp_path_factory):
    """`vllm-omni serve --cpp -pp 2 --cpp-slo --cpp-slo-admission`, shared by the tests below."""
    from tests.helpers.server import BIN, ServerProcess

    model = str(tiny_models["llama-8l"])
    cost_model = tmp_path_factory.mktemp("cpp") / "cost.json"
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
        "--no-cpp-online-calibration",  # admission below relies on the slow model staying
        "--enforce-eager",  # compiled PP: `make demo` (CI runs it before the tests)
    ]
    with ServerProcess(command) as server:
        server.model = model
        yield server


def _slo_counters(text: str) -> tuple[float, ...]:
    """(TTFT outcomes, TPOT outcomes, TTFT slack count, admission refusals); 0 before any."""

    def value(name: str) -> float:
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    outcomes = [
        sum(value(f'vllm_omni:slo_{kind}_total{{outcome="{o}"}}') for o in ("met", "missed"))
        for kind in ("ttft", "tpot")
    ]
    return (
        *outcomes,
        value('vllm_omni:slo_ttft_slack_seconds_bucket{le="+Inf"}'),
        value("vllm_omni:slo_admission_rejected_total"),
    )


@pytest.mark.engine
def test_serve_with_cpp_answers_long_prompts(cpp_server):
    import openai
    import requests

    server, model = cpp_server, cpp_server.model

    def metrics() -> str:
        return requests.get(f"{server.url}/metrics", timeout=10).text

    before = _slo_counters(metrics())  # the fuzz test may have run first
    # The cost model planned with, on /metrics: the file given, not refitted (flag above).
    assert 'vllm_omni:cpp_cost_model_info{source="file",unit="s"} 1.0' in metrics()
    assert _metric(metrics(), 'vllm_omni:cpp_cost_model_coefficient{term="linear"}') == 2e-3
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
    # SLO outcomes: "hello" and the long prompt had TTFT SLOs, "hello" one 100 ms step;
    # one refusal.
    after = _slo_counters(text)
    assert tuple(a - b for a, b in zip(after, before)) == (2, 1, 2, 1)
    assert "CPP scheduler: pp=2" in server.log_text()


SLO_ARGS = ("ttft_slo_ms", "tpot_slo_ms")
SLO_FUZZ_EXAMPLES = 100  # a one-token completion each: ~20-50 ms on 2 cores


def _valid_slo_ms(value) -> bool:
    """The contract: a positive, finite number of ms. vLLM's request model turns JSON true and
    false into 1 and 0 before vllm_omni sees them, so they count as those numbers."""
    if isinstance(value, bool):
        value = int(value)
    return isinstance(value, (int, float)) and value > 0 and math.isfinite(value)


def _beyond_msgpack(value) -> bool:
    # vLLM refuses these itself, naming `extra_args`, before any SLO check: its engine
    # transport (MessagePack) holds integers in [-2**63, 2**64).
    return isinstance(value, int) and not -(2**63) <= value < 2**64


@pytest.mark.engine
def test_fuzz_slo_xargs(cpp_server):
    """Property-based: any mix of valid and invalid SLO values in `vllm_xargs` gets a 200 (or a
    429 from admission control), or a 400 naming an invalid field; never a 5xx."""
    import requests
    from hypothesis import example, given, note
    from hypothesis import strategies as st

    from tests.helpers.openapi_fuzz import fuzz_settings

    int64 = st.integers(-(2**63), 2**63 - 1)
    positive = st.one_of(
        st.integers(min_value=1, max_value=2**64 - 1),
        st.floats(min_value=0, exclude_min=True, allow_infinity=False),  # subnormals too
        st.booleans(),
    )
    not_positive = st.one_of(
        st.integers(-(2**63), 0),
        st.floats(max_value=0),
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.text(max_size=4),
        st.lists(int64, max_size=2),
        st.none(),
    )
    beyond_msgpack = st.one_of(st.integers(min_value=2**64), st.integers(max_value=-(2**63) - 1))
    value = st.one_of(positive, st.one_of(not_positive, beyond_msgpack))  # half valid
    xargs = st.fixed_dictionaries({}, optional={arg: value for arg in SLO_ARGS})
    seen: Counter[int] = Counter()

    @fuzz_settings(max_examples=SLO_FUZZ_EXAMPLES)
    @given(xargs)
    @example({"ttft_slo_ms": 5e-324})  # 0.0 s: the scheduler divided by it (engine died)
    @example({"ttft_slo_ms": 2**64 - 1, "tpot_slo_ms": 1e308})
    @example({"tpot_slo_ms": math.nan, "ttft_slo_ms": True})
    def check(vllm_xargs: dict) -> None:
        note(f"vllm_xargs={vllm_xargs!r}")
        body = {"model": cpp_server.model, "prompt": "hi", "max_tokens": 1}
        # json.dumps writes NaN and Infinity, as a client may; requests' json= would refuse.
        r = requests.post(
            f"{cpp_server.url}/v1/completions",
            data=json.dumps({**body, "vllm_xargs": vllm_xargs}),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        seen[r.status_code] += 1
        # What the 400 may name: an invalid field (vLLM's own type check or ours), or
        # `extra_args` for vLLM's integer range; whichever check runs first answers.
        names = [arg for arg, v in vllm_xargs.items() if not _valid_slo_ms(v)]
        if any(_beyond_msgpack(v) for v in vllm_xargs.values()):
            names.append("extra_args")
        if names:
            assert r.status_code == 400, (r.status_code, r.text)
            assert any(name in r.json()["error"]["message"] for name in names), r.text
        elif r.status_code == 429:  # admission control: only a TTFT SLO can be refused
            assert "ttft_slo_ms" in vllm_xargs and "ttft_slo_ms" in r.json()["error"]["message"]
        else:
            assert r.status_code == 200, (r.status_code, r.text)
            assert r.json()["usage"]["completion_tokens"] == 1

    check()
    print(f"SLO fuzz: {sum(seen.values())} requests, by status {dict(seen)}")
    assert sum(seen.values()) == SLO_FUZZ_EXAMPLES + 3 and seen[200] > 0 and seen[400] > 0
    assert requests.get(f"{cpp_server.url}/health", timeout=10).status_code == 200
