# SPDX-License-Identifier: Apache-2.0
"""`--cpp` and `--cpp-*` flags for `vllm-omni serve` / `vllm serve --omni`, turned into the vLLM
engine arguments of `cpp_engine_args`."""

from __future__ import annotations

import argparse

from vllm_omni.cpp.config import HANDOFFS, CPPConfig
from vllm_omni.cpp.engine_args import cpp_engine_args

# flag -> CPPConfig field
OPTION_FLAGS = {
    "--cpp-num-steps": "num_steps",
    "--cpp-min-chunk": "min_chunk",
    "--cpp-handoff": "handoff",
    "--cpp-micro-chunks": "micro_chunks",
    "--cpp-cost-model": "cost_model",
    "--cpp-overhead-tokens": "overhead_tokens",
    "--cpp-online-calibration": "online_calibration",
    "--cpp-slo": "slo",
    "--cpp-ttft-slo-ms": "ttft_slo_ms",
    "--cpp-tpot-slo-ms": "tpot_slo_ms",
    "--cpp-slo-admission": "admission",
}


def add_cpp_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "CPP", "Chunked pipeline parallelism: prefill chunks sized by a compute budget per step."
    )
    group.add_argument("--cpp", action="store_true", help="Enable CPP (use with -pp N, N > 1).")
    group.add_argument(
        "--cpp-num-steps",
        type=int,
        default=None,
        metavar="N",
        help="Pipeline steps per long prefill (default: chosen per prompt).",
    )
    group.add_argument(
        "--cpp-micro-chunks",
        type=int,
        default=None,
        metavar="K",
        help="Split each step's prefill chunk in the worker into K micro-chunks that stream "
        "through the PP stages (RFC phase 2; default 1: off).",
    )
    group.add_argument(
        "--cpp-min-chunk",
        type=int,
        default=None,
        metavar="TOKENS",
        help="Smallest prefill chunk; shorter tails merge into the chunk before.",
    )
    group.add_argument(
        "--cpp-handoff",
        choices=HANDOFFS,
        default=None,
        help="How the PP stages pass a chunk on, which long prefills are planned for: 'free' "
        "(equal-cost chunks; the default) or 'rendezvous' (a stage hands a chunk on only when "
        "the next takes it, as vLLM's CPU pipeline does; two stages).",
    )
    group.add_argument(
        "--cpp-cost-model",
        default=None,
        metavar="PATH",
        help="Cost model JSON from `python -m vllm_omni.cpp.calibrate` "
        "(default: the cached calibration, else the analytic FLOP model).",
    )
    group.add_argument(
        "--cpp-overhead-tokens",
        type=int,
        default=None,
        metavar="TOKENS",
        help="Analytic model only: fixed cost per step, in tokens of linear work.",
    )
    group.add_argument(
        "--cpp-online-calibration",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Fit the cost model to the steps as they run, starting from --cpp-cost-model, the "
        "cached calibration or the analytic model, and cache the fit (default: on).",
    )
    group.add_argument(
        "--cpp-slo",
        action="store_true",
        default=None,
        help="SLO-aware scheduling: prefills share each step smallest remaining first, one "
        "about to miss its TTFT SLO ahead of them "
        "(per-request SLOs: vllm_xargs ttft_slo_ms / tpot_slo_ms).",
    )
    group.add_argument(
        "--cpp-ttft-slo-ms",
        type=float,
        default=None,
        metavar="MS",
        help="Default TTFT SLO for requests that set none (with --cpp-slo).",
    )
    group.add_argument(
        "--cpp-tpot-slo-ms",
        type=float,
        default=None,
        metavar="MS",
        help="Default TPOT SLO for requests that set none (with --cpp-slo).",
    )
    group.add_argument(
        "--cpp-slo-admission",
        action="store_true",
        default=None,
        help="Refuse with HTTP 429 a request whose TTFT SLO cannot be met with the prefill "
        "work already queued (with --cpp-slo and a calibrated cost model).",
    )


def apply_cpp_args(args: argparse.Namespace) -> None:
    """Rewrite parsed serve args in place so vLLM builds a CPP engine; errors name the flag."""
    given = {
        flag: field
        for flag, field in OPTION_FLAGS.items()
        if getattr(args, field_attr(flag)) is not None
    }
    if not args.cpp:
        if given:
            raise ValueError(f"{', '.join(given)} needs --cpp")
        return
    options = {field: getattr(args, field_attr(flag)) for flag, field in given.items()}
    try:
        config = CPPConfig.from_dict(options)
        engine_args = cpp_engine_args(
            config,
            pipeline_parallel_size=args.pipeline_parallel_size,
            enable_chunked_prefill=args.enable_chunked_prefill,
            scheduler_cls=args.scheduler_cls,
            worker_cls=args.worker_cls,
            additional_config=args.additional_config,
            logits_processors=args.logits_processors,
        )
    except ValueError as e:
        raise ValueError(f"--cpp: {e}") from None
    args.scheduler_cls = engine_args["scheduler_cls"]
    args.worker_cls = engine_args["worker_cls"]
    args.additional_config = engine_args["additional_config"]
    if "logits_processors" in engine_args:
        args.logits_processors = engine_args["logits_processors"]
    args.enable_chunked_prefill = True
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = engine_args["max_num_batched_tokens"]


def field_attr(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
