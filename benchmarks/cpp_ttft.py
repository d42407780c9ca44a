# SPDX-License-Identifier: Apache-2.0
"""TTFT of long prompts: plain vLLM PP=1, plain vLLM PP=2 at fixed chunk sizes, and CPP PP=2.

    python -m benchmarks.cpp_ttft --json out/cpp_ttft.json --png out/cpp_gantt.png
    python -m benchmarks.cpp_ttft --both-orders --json out/cpp_ttft_both_orders.json
    python -m benchmarks.cpp_ttft --both-orders --only "chunk 1024" "micro" \
        --micro-chunks 2 --lengths 16384 --json out/cpp_both_orders.json

All configurations run in one invocation on the tiny 8-layer Llama (random token ids, prefix
caching off, max_tokens=1): PP=1 on one core; PP=2 on one core per stage. The machines here are
noisy (run-to-run drift of 10-25%), so the comparison is paired: the CPP engine stays up while each
baseline engine runs, and every baseline prefill is followed by a CPP prefill of the same prompt;
each ratio compares a baseline with the CPP runs interleaved with it. Every engine runs in a
process of its own. The engine started first is slower on this VM (see `Engine`), which the full
table does not correct for: CPP starts first. `--both-orders` instead starts each baseline with a
fresh CPP engine in both orders and reports the geometric mean of the two ratios (the same
headline ratios, without the step timelines; four engine starts per baseline). Each timed
prefill waits `QUIET_S` first, until the other engine's processes have stopped busy-polling. Each
engine uses vllm_omni's CPP worker, which only records a per-rank busy timeline, so every
configuration reports: median TTFT of --runs runs (after one warm-up), the per-step compute-load
balance (max/mean under the CPP cost model) and the pipeline bubble measured from the per-stage
busy timelines, next to (p-1)/(m+p-1) for its m chunks.

CPP runs with its defaults. It uses the cost model calibrated on this machine; if there is none
yet, the benchmark calibrates first (`vllm_omni.cpp.calibrate`, cached for later runs).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import geomean, write_result

DEFAULT_LENGTHS = (8192, 16384, 32768)
DEFAULT_CHUNKS = (256, 512, 1024, 2048, 4096)
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
CPP_NAME = "CPP PP=2"
PLAIN_PP2 = "plain PP=2"
QUIET_S = 1.5
"""Pause before each timed prefill. vLLM's shared-memory queue readers busy-loop for 1 s after
each message, so the engine that ran last would otherwise spin its workers on the same cores
for the first second of the other engine's run (vllm_omni's `cpu_shm_reader_nap` patch cuts
the spin to 5 ms; the pause stays for runs without the plugin)."""


@dataclass
class Config:
    name: str
    pp: int
    engine_args: dict[str, Any]


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


def configs(chunks: tuple[int, ...], model_len: int, micro: tuple[int, ...] = ()) -> list[Config]:
    from vllm_omni.cpp import cpp_engine_args
    from vllm_omni.worker.hooks import with_worker_hooks

    # 1 GiB of KV per worker holds 512K tokens of the tiny model; two engines are up at once.
    base = dict(max_model_len=model_len, enable_prefix_caching=False, kv_cache_memory_bytes=1 << 30)
    timed = with_worker_hooks(base, "cpp")  # CPP's step timeline, without its scheduler
    out = [Config("plain PP=1", 1, dict(timed, max_num_batched_tokens=2048))]
    out += [
        Config(
            f"{PLAIN_PP2} chunk {c}",
            2,
            dict(timed, pipeline_parallel_size=2, max_num_batched_tokens=c),
        )
        for c in chunks
    ]
    out += [
        Config(
            f"CPP micro-chunks {k}",
            2,
            cpp_engine_args({"micro_chunks": k}, pipeline_parallel_size=2, **base),
        )
        for k in micro
    ]
    out.append(Config(CPP_NAME, 2, cpp_engine_args(pipeline_parallel_size=2, **base)))
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


class Engine:
    """One engine of a configuration in a process of its own, timing single-prompt prefills.

    Its own process because, within one Python process, the engine created first runs its
    prefills 13-28% slower than the engines created after it (measured with identical
    configurations; cause not found). A server runs one engine per process, so here every engine
    is the first of its process, and no configuration gains from the order of creation.
    """

    def __init__(self, config: Config, model: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.config = config
        self._conn, child = context.Pipe()
        # Not a daemon: the engine starts processes of its own.
        self._process = context.Process(target=_engine_process, args=(config, model, child))
        self._process.start()
        child.close()
        self._call("ready")

    def _call(self, *message: Any) -> Any:
        self._conn.send(message)
        ok, value = self._conn.recv()
        if not ok:
            raise RuntimeError(f"{self.config.name}: {value}")
        return value

    def prefill(self, prompt_ids: list[int]) -> tuple[float, list[list[dict]]]:
        return self._call("prefill", prompt_ids)

    def close(self) -> None:
        if self._process.is_alive():
            self._call("close")
        self._process.join(timeout=120)


def _engine_process(config: Config, model: str, conn) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if config.pp <= len(cores):  # one core per rank; with more ranks, the plugin's default
        os.environ[BIND_ENV] = "|".join(map(str, cores[: config.pp]))
    from vllm import LLM, SamplingParams

    llm = None
    try:
        while True:
            command, *args = conn.recv()
            if command == "ready":
                llm = LLM(model=model, **config.engine_args)
                conn.send((True, None))
            elif command == "prefill":
                time.sleep(QUIET_S)
                llm.collective_rpc("cpp_take_step_records")
                start = time.perf_counter()
                llm.generate(
                    [{"prompt_token_ids": args[0]}], SamplingParams(max_tokens=1), use_tqdm=False
                )
                elapsed = time.perf_counter() - start
                conn.send((True, (elapsed, llm.collective_rpc("cpp_take_step_records"))))
            elif command == "close":
                conn.send((True, None))
                return
    except Exception as e:  # reported to the parent, which raises it
        conn.send((False, repr(e)))
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()


def add_run(result: Result, elapsed: float, records, cost_model) -> None:
    result.ttft_s.append(elapsed)
    result.chunks, result.balance, bubble, result.timeline = step_summary(records, cost_model)
    runs = len(result.ttft_s)
    result.bubble += (bubble - result.bubble) / runs  # running mean
    m, p = len(result.chunks), result.pp
    result.ideal_bubble = (p - 1) / (m + p - 1)


def auto_dtype() -> str:
    """The dtype the engines run at (`--dtype auto`): the bf16 checkpoint's, or float32 on a
    CPU without native bf16 (vllm_omni's CPU default)."""
    import torch

    from vllm_omni.platform.cpu_dtype import resolved_on_this_cpu

    return str(resolved_on_this_cpu(torch.bfloat16)).removeprefix("torch.")


def make_prompts(lengths, runs: int) -> dict[int, list[list[int]]]:
    """Per prompt length, one warm-up prompt and `runs` timed ones of random token ids (seeded)."""
    rng = random.Random(0)
    return {
        n: [[rng.randrange(3, 2000) for _ in range(n)] for _ in range(runs + 1)] for n in lengths
    }


def run_paired(
    baselines: list[Config], cpp_config: Config, model: str, lengths, runs: int, cost_model
) -> list[tuple[Result, Result]]:
    """(baseline, CPP interleaved with it) per baseline configuration and prompt length."""
    prompts = make_prompts(lengths, runs)
    cpp = Engine(cpp_config, model)
    for n in lengths:
        cpp.prefill(prompts[n][0])  # warm-up (and compilation)
    pairs = []
    for config in baselines:
        print(f"{config.name} (paired with {cpp_config.name}):", flush=True)
        engine = Engine(config, model)
        for n in lengths:
            base = Result(config.name, config.pp, n)
            paired = Result(cpp_config.name, cpp_config.pp, n)
            engine.prefill(prompts[n][0])
            for run in range(1, runs + 1):
                add_run(base, *engine.prefill(prompts[n][run]), cost_model)
                add_run(paired, *cpp.prefill(prompts[n][run]), cost_model)
            for r in (base, paired):
                print(
                    f"  {r.name:22s} {n:6d} tokens: TTFT {r.median_s:7.3f} s  "
                    f"({len(r.chunks)} chunks, balance {r.balance:.3f}, bubble {r.bubble:.1%})",
                    flush=True,
                )
            pairs.append((base, paired))
        engine.close()
    cpp.close()
    return pairs


def run_both_orders(
    baselines: list[Config],
    cpp_config: Config,
    model: str,
    lengths,
    runs: int,
    trace: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Baseline TTFT / CPP TTFT with a fresh pair of engines started in each order (see
    `Engine`: the engine started first is slower here), per prompt length, and the geometric mean
    of the two orders' ratios. One pair per order serves every length; runs alternate engines.
    `trace`, if given, gets the first prompt's TTFT of the first pair ("first_prompt") and the
    step records of every timed prefill by configuration name ("records", with their TTFTs in
    "ttft_s")."""
    prompts = make_prompts(lengths, runs)
    out: dict[str, dict[str, Any]] = {}
    for config in baselines:
        print(f"{config.name} / {cpp_config.name}:", flush=True)
        per_length: dict[int, list[dict[str, Any]]] = {n: [] for n in lengths}
        for order in ((config, cpp_config), (cpp_config, config)):
            engines = [Engine(c, model) for c in order]
            for n in lengths:
                warm = {e.config.name: e.prefill(prompts[n][0])[0] for e in engines}
                if trace is not None and "first_prompt" not in trace:
                    trace["first_prompt"] = {
                        "prompt_len": n,
                        "baseline": config.name,
                        "ttft_s": warm,
                    }
                    print(f"  first {n}-token prompt of each engine: {warm}", flush=True)
                times: dict[str, list[float]] = {c.name: [] for c in order}
                for run in range(1, runs + 1):
                    for engine in engines if run % 2 else engines[::-1]:
                        elapsed, records = engine.prefill(prompts[n][run])
                        times[engine.config.name].append(elapsed)
                        if trace is not None:
                            name = engine.config.name
                            trace.setdefault("records", {}).setdefault(name, []).append(records)
                            trace.setdefault("ttft_s", {}).setdefault(name, []).append(elapsed)
                base, cpp = (statistics.median(times[c.name]) for c in (config, cpp_config))
                per_length[n].append(
                    {"started_first": order[0].name, "baseline_s": base, "cpp_s": cpp}
                )
                print(
                    f"  {n:6d} tokens, {order[0].name} started first: {base:.3f} s / "
                    f"{cpp:.3f} s = {base / cpp:.3f}",
                    flush=True,
                )
            for engine in engines:
                engine.close()
        for n, orders in per_length.items():
            both = geomean(o["baseline_s"] / o["cpp_s"] for o in orders)
            print(f"  {n:6d} tokens, both orders: {both:.3f}", flush=True)
            out.setdefault(config.name, {})[str(n)] = {"orders": orders, "both_orders": both}
    return out


def summarize_both_orders(result: dict[str, dict[str, Any]], lengths) -> dict[str, Any]:
    """Per length: CPP's speed-up over PP=1, over the best fixed chunk and over 2048, each the
    geometric mean of both start orders (> 1: CPP faster)."""
    table: dict[str, Any] = {}
    print("\nboth orders: baseline TTFT / CPP TTFT (> 1: CPP faster)")
    for n in lengths:
        ratio = {name: r[str(n)]["both_orders"] for name, r in result.items() if str(n) in r}
        fixed = {k: v for k, v in ratio.items() if k.startswith(PLAIN_PP2)}
        entry: dict[str, Any] = {
            "cpp_vs_pp1": next((v for k, v in ratio.items() if "PP=1" in k), None),
            "cpp_vs_default_2048": ratio.get(f"{PLAIN_PP2} chunk 2048"),
        }
        print(f"  {n:6d} tokens: " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
        if fixed:
            best = min(fixed, key=fixed.get)
            entry |= {"cpp_vs_best_fixed": fixed[best], "best_fixed": best}
            print(f"  {'':6s}  CPP vs the best fixed chunk ({best}): {fixed[best]:.3f}")
        table[str(n)] = entry
    return table


def report(pairs: list[tuple[Result, Result]], lengths) -> dict[str, Any]:
    table: dict[str, Any] = {}
    print("\n(speed-up = baseline TTFT / TTFT of the CPP runs interleaved with it)")
    for n in lengths:
        rows = [(b, c) for b, c in pairs if b.prompt_len == n]
        speedup = {b.name: b.median_s / c.median_s for b, c in rows}
        plain = [b for b, _ in rows if b.name.startswith(PLAIN_PP2)]
        best = min(plain, key=lambda r: r.median_s)
        cpp_all = [t for _, c in rows for t in c.ttft_s]
        print(f"prompt {n} tokens:")
        print(
            f"  {'baseline':22s} {'TTFT s':>8s} {'CPP s':>8s} {'speed-up':>8s} {'chunks':>6s} "
            f"{'balance':>7s} {'bubble':>7s} {'ideal':>6s}"
        )
        for b, c in rows:
            print(
                f"  {b.name:22s} {b.median_s:8.3f} {c.median_s:8.3f} {speedup[b.name]:8.3f} "
                f"{len(b.chunks):6d} {b.balance:7.3f} {b.bubble:7.1%} {b.ideal_bubble:6.1%}"
            )
        cpp = rows[0][1]
        print(
            f"  {'CPP PP=2 (all runs)':22s} {'':8s} {statistics.median(cpp_all):8.3f} {'':8s} "
            f"{len(cpp.chunks):6d} {cpp.balance:7.3f} "
            f"{statistics.mean(c.bubble for _, c in rows):7.1%} {cpp.ideal_bubble:6.1%}"
        )
        entry = {
            "cpp_vs_pp1": next(v for k, v in speedup.items() if "PP=1" in k),
            "cpp_vs_best_fixed": speedup[best.name],
            "best_fixed": best.name,
            "cpp_vs_default_2048": speedup.get("plain PP=2 chunk 2048"),
            "cpp_balance": cpp.balance,
            "cpp_bubble": statistics.mean(c.bubble for _, c in rows),
            "cpp_ideal_bubble": cpp.ideal_bubble,
        }
        print(
            f"  CPP: {entry['cpp_vs_pp1']:.2f}x PP=1, {entry['cpp_vs_best_fixed']:.3f}x best fixed"
            f" ({best.name})"
            + (
                f", {entry['cpp_vs_default_2048']:.3f}x default 2048"
                if entry["cpp_vs_default_2048"]
                else ""
            )
        )
        table[str(n)] = entry
    return table


def draw_stages(ax, spans: list[dict[str, Any]], pp: int) -> None:
    """One bar per {rank, start_s, end_s} span, one row per stage (a matplotlib axis)."""
    for span in spans:
        ax.barh(
            span["rank"],
            span["end_s"] - span["start_s"],
            left=span["start_s"],
            height=0.6,
            color=f"C{span['rank']}",
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks(range(pp), [f"stage {k}" for k in range(pp)])
    ax.invert_yaxis()


def plot_gantt(pairs: list[tuple[Result, Result]], prompt_len: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(b, c) for b, c in pairs if b.prompt_len == prompt_len and b.name.startswith(PLAIN_PP2)]
    plain, cpp = min(rows, key=lambda bc: bc[0].median_s)
    default = next((b for b, _ in rows if b.name.endswith(" 2048")), plain)
    shown = [default, plain, cpp] if default is not plain else [plain, cpp]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 1.6 * len(shown) + 0.6), sharex=True)
    for ax, r in zip(axes, shown):
        draw_stages(ax, r.timeline, r.pp)
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
    parser.add_argument(
        "--both-orders",
        action="store_true",
        help="instead of the paired table: each selected baseline against a fresh CPP engine, "
        "the pair started in both orders (slower; cancels the started-first bias)",
    )
    parser.add_argument(
        "--micro-chunks",
        type=int,
        nargs="*",
        default=[],
        metavar="K",
        help="also pair CPP with CPP whose workers split each step into K micro-chunks",
    )
    parser.add_argument("--only", nargs="+", default=None, help="substrings of config names to run")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None, help="Gantt chart of the PP=2 stages")
    args = parser.parse_args()

    from vllm_omni.cpp.cost_model import CostModel
    from vllm_omni.cpp.cost_model_source import calibration_path
    from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

    model = args.model or str(build_tiny_models(default_models_dir(), ["llama-8l"])["llama-8l"])
    model_len = max(args.lengths) + 64
    # Calibrations are kept per dtype.
    cal_path = calibration_path(model, 2, f"torch.{auto_dtype()}", "cpu")
    if not cal_path.is_file():
        from vllm_omni.cpp.calibrate import calibrate

        os.environ[BIND_ENV] = "0|1"
        print("no CPP calibration for this model yet: calibrating (cached for later runs)")
        calibrate(model, pipeline_parallel_size=2)
    cost_model = CostModel.load(cal_path)
    print(f"cost model (per stage, PP=2): {cost_model}")

    all_configs = configs(tuple(args.chunks), model_len, tuple(args.micro_chunks))
    baselines = [c for c in all_configs if c.name != CPP_NAME]
    if args.only:
        baselines = [c for c in baselines if any(s in c.name for s in args.only)]
    cpp_config = next(c for c in all_configs if c.name == CPP_NAME)
    if args.both_orders:
        result = run_both_orders(baselines, cpp_config, model, args.lengths, args.runs)
        summary = summarize_both_orders(result, args.lengths)
        write_result(args.json, {"ratios": summary, "both_orders": result}, dtype=auto_dtype())
        return
    pairs = run_paired(baselines, cpp_config, model, args.lengths, args.runs, cost_model)
    print("\npaired: baseline TTFT / TTFT of the CPP runs interleaved with it (> 1: CPP faster)")
    for base, cpp in pairs:
        print(
            f"  {base.name:24s} {base.prompt_len:6d}: {base.median_s:7.3f} s / "
            f"{cpp.median_s:7.3f} s = {base.median_s / cpp.median_s:.3f}"
        )
    has_reference = any(b.pp == 1 for b, _ in pairs) and any(
        b.name.startswith(PLAIN_PP2) for b, _ in pairs
    )
    ratios = report(pairs, args.lengths) if has_reference else {}
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot_gantt(pairs, max(args.lengths), args.png)
    records = [
        {
            "name": r.name if r is pair[0] else f"{r.name} (with {pair[0].name})",
            "pp": r.pp,
            "prompt_len": r.prompt_len,
            "chunks": r.chunks,
            "ttft_s": r.median_s,
            "ttft_runs_s": r.ttft_s,
            "balance": r.balance,
            "bubble": r.bubble,
            "ideal_bubble": r.ideal_bubble,
        }
        for pair in pairs
        for r in pair
    ]
    out = {"cost_model": cost_model.to_dict(), "cost_model_pp": 2, "ratios": ratios}
    write_result(args.json, {**out, "records": records}, dtype=auto_dtype())


if __name__ == "__main__":
    main()
