# SPDX-License-Identifier: Apache-2.0
"""TTFT of long prompts: plain vLLM PP=1, plain vLLM PP=2 at fixed chunk sizes, and CPP PP=2.

    .venv/bin/python benchmarks/cpp_ttft.py --json out/cpp_ttft.json --png out/cpp_gantt.png

All configurations run in one invocation, side by side, on the tiny 8-layer Llama (random token
ids, prefix caching off, max_tokens=1): PP=1 on one core; PP=2 on one core per stage. Each engine
uses vllm_omni's CPP worker, which only records a per-rank busy timeline, so every configuration
reports: median TTFT of --runs runs (after one warm-up), the ratio to PP=1 and to plain PP=2, the
per-step compute-load balance (max/mean under the CPP cost model) and the pipeline bubble measured
from the per-stage busy timelines, next to (p-1)/(m+p-1) for its m chunks.

CPP runs with its defaults. It uses the cost model calibrated on this machine; if there is none
yet, the benchmark calibrates first (`vllm_omni.cpp.calibrate`, cached for later runs).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_LENGTHS = (8192, 16384, 32768)
DEFAULT_CHUNKS = (256, 512, 1024, 2048, 4096)
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass
class Config:
    name: str
    pp: int
    engine_args: dict[str, Any]
    chunk: int | None = None  # fixed chunk size (plain vLLM), None for PP=1 default and CPP


@dataclass
class Result:
    name: str
    pp: int
    prompt_len: int
    ttft_s: list[float] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    balance: float = 0.0
    bubble: float = 0.0
    ideal_bubble: float = 0.0
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.ttft_s)


def configs(chunks: tuple[int, ...], model_len: int) -> list[Config]:
    from vllm_omni.cpp import cpp_engine_args
    from vllm_omni.cpp.worker import worker_cls_for_platform

    base = dict(max_model_len=model_len, enable_prefix_caching=False)
    timed = dict(base, worker_cls=worker_cls_for_platform())
    out = [Config("plain PP=1", 1, dict(timed, max_num_batched_tokens=2048), 2048)]
    out += [
        Config(
            f"plain PP=2 chunk {c}",
            2,
            dict(timed, pipeline_parallel_size=2, max_num_batched_tokens=c),
            c,
        )
        for c in chunks
    ]
    out.append(Config("CPP PP=2", 2, cpp_engine_args(pipeline_parallel_size=2, **base)))
    return out


def step_summary(
    records_per_rank: list[list[dict]], cost_model
) -> tuple[list[int], float, float, list]:
    """Chunks, load balance (max/mean) and measured bubble of one prefill's steps."""
    from vllm_omni.cpp.chunking import balance

    steps = records_per_rank[0]
    chunks = [sum(x for x, _ in r["chunks"]) for r in steps]
    start = min(r[0]["start_s"] for r in records_per_rank)
    end = max(r[-1]["end_s"] for r in records_per_rank)
    busy = sum(rec["end_s"] - rec["start_s"] for r in records_per_rank for rec in r)
    bubble = 1 - busy / (len(records_per_rank) * (end - start))
    timeline = [
        {"rank": rank, "start_s": rec["start_s"] - start, "end_s": rec["end_s"] - start}
        for rank, r in enumerate(records_per_rank)
        for rec in r
    ]
    return chunks, balance(chunks, cost_model), bubble, timeline


def run_config(config: Config, model: str, lengths, runs: int, cost_model) -> list[Result]:
    from vllm import LLM, SamplingParams

    os.environ[BIND_ENV] = "0" if config.pp == 1 else "|".join(str(r) for r in range(config.pp))
    llm = LLM(model=model, **config.engine_args)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(0)
    results = []
    for n in lengths:
        result = Result(config.name, config.pp, n)
        for run in range(runs + 1):  # run 0 warms up (and compiles)
            prompt = {"prompt_token_ids": [rng.randrange(vocab) for _ in range(n)]}
            llm.collective_rpc("cpp_take_step_records")
            start = time.perf_counter()
            llm.generate([prompt], params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            records = llm.collective_rpc("cpp_take_step_records")
            if run == 0:
                continue
            result.ttft_s.append(elapsed)
            result.chunks, balance, bubble, timeline = step_summary(records, cost_model)
            result.balance, result.timeline = balance, timeline
            result.bubble = bubble if run == 1 else result.bubble + bubble
        result.bubble /= runs
        m, p = len(result.chunks), config.pp
        result.ideal_bubble = (p - 1) / (m + p - 1)
        print(
            f"  {config.name:22s} {n:6d} tokens: TTFT {result.median_s:7.3f} s  "
            f"({m} chunks, balance {result.balance:.3f}, bubble {result.bubble:.1%})",
            flush=True,
        )
        results.append(result)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return results


def report(results: list[Result], lengths) -> dict[str, Any]:
    table: dict[str, Any] = {}
    print()
    for n in lengths:
        rows = [r for r in results if r.prompt_len == n]
        pp1 = next(r for r in rows if r.pp == 1)
        plain = [r for r in rows if r.pp == 2 and r.name.startswith("plain")]
        best = min(plain, key=lambda r: r.median_s)
        default = next((r for r in plain if r.name.endswith(" 2048")), None)
        print(f"prompt {n} tokens: (ratios are speed-ups, higher is better)")
        print(
            f"  {'config':22s} {'TTFT s':>8s} {'vs PP=1':>8s} {'vs best':>8s} {'chunks':>6s} "
            f"{'balance':>7s} {'bubble':>7s} {'ideal':>6s}"
        )
        for r in rows:
            print(
                f"  {r.name:22s} {r.median_s:8.3f} {pp1.median_s / r.median_s:8.2f} "
                f"{best.median_s / r.median_s:8.3f} {len(r.chunks):6d} {r.balance:7.3f} "
                f"{r.bubble:7.1%} {r.ideal_bubble:6.1%}"
            )
        cpp = next(r for r in rows if r.name.startswith("CPP"))
        entry = {
            "cpp_vs_pp1": pp1.median_s / cpp.median_s,
            "cpp_vs_best_fixed": best.median_s / cpp.median_s,
            "best_fixed": best.name,
            "cpp_vs_default_2048": default.median_s / cpp.median_s if default else None,
        }
        print(
            f"  CPP: {entry['cpp_vs_pp1']:.2f}x PP=1, {entry['cpp_vs_best_fixed']:.3f}x best fixed "
            f"({best.name}), "
            + (f"{entry['cpp_vs_default_2048']:.3f}x default 2048" if default else "")
        )
        table[str(n)] = entry
    return table


def plot_gantt(results: list[Result], prompt_len: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r.prompt_len == prompt_len and r.pp == 2]
    plain = min((r for r in rows if r.name.startswith("plain")), key=lambda r: r.median_s)
    default = next((r for r in rows if r.name.endswith(" 2048")), plain)
    cpp = next(r for r in rows if r.name.startswith("CPP"))
    shown = [default, plain, cpp] if default is not plain else [plain, cpp]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 1.6 * len(shown) + 0.6), sharex=True)
    for ax, r in zip(axes, shown):
        for rec in r.timeline:
            ax.barh(
                rec["rank"],
                rec["end_s"] - rec["start_s"],
                left=rec["start_s"],
                height=0.6,
                color=f"C{rec['rank']}",
                edgecolor="white",
                linewidth=0.3,
            )
        ax.set_yticks(range(r.pp), [f"stage {k}" for k in range(r.pp)])
        ax.invert_yaxis()
        ax.set_title(f"{r.name}: {len(r.chunks)} chunks, bubble {r.bubble:.1%}", fontsize=9)
    axes[-1].set_xlabel("seconds since the first step (last measured run)")
    fig.suptitle(f"Per-stage busy time, {prompt_len}-token prompt", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the tiny llama-8l")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    parser.add_argument("--chunks", type=int, nargs="+", default=list(DEFAULT_CHUNKS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="+", default=None, help="substrings of config names to run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None, help="Gantt chart of the PP=2 stages")
    args = parser.parse_args()

    from vllm_omni.cpp.cost_model import CostModel
    from vllm_omni.cpp.cost_model_source import calibration_dir, calibration_key
    from vllm_omni.models.tiny import build_tiny_models, default_models_dir

    model = args.model or str(build_tiny_models(default_models_dir(), ["llama-8l"])["llama-8l"])
    model_len = max(args.lengths) + 64
    cal_path = calibration_dir() / f"{calibration_key(model, 2, 'torch.bfloat16', 'cpu')}.json"
    if not cal_path.is_file():
        from vllm_omni.cpp.calibrate import calibrate

        os.environ[BIND_ENV] = "0|1"
        print("no CPP calibration for this model yet: calibrating (cached for later runs)")
        calibrate(model, pipeline_parallel_size=2)
    cost_model = CostModel.load(cal_path)
    print(f"cost model (per stage, PP=2): {cost_model}")

    results: list[Result] = []
    for config in configs(tuple(args.chunks), model_len):
        if args.only and not any(s in config.name for s in args.only):
            continue
        print(f"{config.name}:", flush=True)
        results += run_config(config, model, args.lengths, args.runs, cost_model)
    ratios = report(results, args.lengths) if not args.only else {}
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot_gantt(results, max(args.lengths), args.png)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "machine": {"cpus": os.cpu_count()},
                    "cost_model": cost_model.to_dict(),
                    "cost_model_pp": 2,
                    "ratios": ratios,
                    "records": [
                        {
                            "name": r.name,
                            "pp": r.pp,
                            "prompt_len": r.prompt_len,
                            "chunks": r.chunks,
                            "ttft_s": r.median_s,
                            "ttft_runs_s": r.ttft_s,
                            "balance": r.balance,
                            "bubble": r.bubble,
                            "ideal_bubble": r.ideal_bubble,
                        }
                        for r in results
                    ],
                },
                indent=1,
            )
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
