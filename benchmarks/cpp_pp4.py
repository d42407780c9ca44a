# SPDX-License-Identifier: Apache-2.0
"""CPP at PP=4, as the design states it: measured step timeline against the simulator's.

    python -m benchmarks.cpp_pp4 --json out/cpp_pp4.json --png out/cpp_pp4.png

The tiny 8-layer Llama (two layers per stage), one long prompt after a warm-up, `--runs` times,
for CPP at PP=4 and plain vLLM PP=4 at its default 2048-token chunks, one engine at a time
(each in its own process; benchmarks/cpp_ttft.py's `Engine`). Every rank records when it
computes which chunks; from that, per configuration: median TTFT, chunks, and the measured
bubble. Then the simulator (`vllm_omni.cpp.simulator`) runs the same chunks through 4 stages
with a cost model fitted to these very steps (slowest rank per step, both configurations), vLLM's
4 steps in flight: the projected TTFT and bubble beside the measured ones, and both timelines in
one figure.

On a machine with fewer cores than ranks (2 cores here) the four stages share the cores, so a
stage's step takes longer while other stages compute, and the measured pipeline overlaps less
than the simulator's equal-speed stages: the gap between the two columns is that contention, not
a property of CPP. Run it where every rank has its own cores for the real comparison.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from benchmarks.cpp_ttft import (
    Config,
    Engine,
    auto_dtype,
    draw_stages,
    make_prompts,
    step_summary,
)

PP = 4


def configs(model_len: int) -> list[Config]:
    from vllm_omni.cpp import cpp_engine_args
    from vllm_omni.worker.hooks import with_worker_hooks

    base = dict(max_model_len=model_len, enable_prefix_caching=False, kv_cache_memory_bytes=1 << 30)
    plain = dict(with_worker_hooks(base, "cpp"), pipeline_parallel_size=PP)
    return [
        Config(f"plain PP={PP} chunk 2048", PP, dict(plain, max_num_batched_tokens=2048)),
        Config(f"CPP PP={PP}", PP, cpp_engine_args(pipeline_parallel_size=PP, **base)),
    ]


def measure(config: Config, model: str, prompts: list[list[int]]) -> dict[str, Any]:
    engine = Engine(config, model)
    try:
        engine.prefill(prompts[0])  # warm-up
        runs = [engine.prefill(p) for p in prompts[1:]]
    finally:
        engine.close()
    ttfts = [elapsed for elapsed, _ in runs]
    _, records = runs[-1]
    return {"name": config.name, "ttft_s": ttfts, "records": records}


def summarize(result: dict[str, Any], cost_model) -> dict[str, Any]:
    from vllm_omni.cpp.simulator import simulate

    chunks, balance, bubble, timeline = step_summary(result["records"], cost_model)
    sim = simulate(chunks, cost_model, PP, max_in_flight=PP)
    busy = [
        sum(r["end_s"] - r["start_s"] for r in rank_records) for rank_records in result["records"]
    ]
    return {
        "name": result["name"],
        "ttft_s": result["ttft_s"],
        "median_ttft_s": statistics.median(result["ttft_s"]),
        "chunks": chunks,
        "balance": balance,
        "measured_bubble": bubble,
        "busy_s_per_rank": busy,
        "timeline": timeline,
        "simulated_ttft_s": sim.makespan,
        "simulated_bubble": sim.bubble,
        "simulated_timeline": [
            {"rank": span.stage, "start_s": span.start, "end_s": span.end}
            for chunk in sim.timeline
            for span in chunk
        ],
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(r, kind) for r in rows for kind in ("measured", "simulated")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 1.9 * len(panels) + 0.6), sharex=True)
    for ax, (row, kind) in zip(axes, panels):
        draw_stages(ax, row["timeline" if kind == "measured" else "simulated_timeline"], PP)
        bubble = row["measured_bubble" if kind == "measured" else "simulated_bubble"]
        ax.set_title(f"{row['name']}, {kind}: {len(row['chunks'])} chunks, bubble {bubble:.1%}")
    axes[-1].set_xlabel("seconds since the first step (last run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()

    from vllm_omni.cpp.calibrate import samples_from_records
    from vllm_omni.cpp.cost_model import CostModel
    from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

    model = str(build_tiny_models(default_models_dir(), ["llama-8l"])["llama-8l"])
    prompts = make_prompts([args.length], args.runs)[args.length]
    results = [measure(c, model, prompts) for c in configs(args.length + 64)]
    fit = CostModel.fit(s for r in results for s in samples_from_records(r["records"]))
    rows = [summarize(r, fit.model) for r in results]

    print(f"\nPP={PP}, {args.length}-token prompt, {args.runs} runs; cost model fitted to these")
    print(f"steps: relative RMS error {fit.rel_rmse:.1%} over {fit.num_samples} steps")
    header = ("configuration", "chunks", "TTFT s", "sim s", "bubble", "sim")
    print("{:24s} {:>6s} {:>8s} {:>8s} {:>7s} {:>6s}".format(*header))
    for r in rows:
        print(
            f"{r['name']:24s} {len(r['chunks']):6d} {r['median_ttft_s']:8.3f} "
            f"{r['simulated_ttft_s']:8.3f} {r['measured_bubble']:7.1%} {r['simulated_bubble']:6.1%}"
        )
    plain, cpp = rows
    print(
        f"CPP / plain TTFT: measured {plain['median_ttft_s'] / cpp['median_ttft_s']:.3f}x, "
        f"simulated {plain['simulated_ttft_s'] / cpp['simulated_ttft_s']:.3f}x"
    )
    out = {
        "pp": PP,
        "prompt_len": args.length,
        "cost_model": fit.model.to_dict(),
        "fit_rel_rmse": fit.rel_rmse,
        "configs": rows,
    }
    write_result(args.json, out, dtype=auto_dtype())
    if args.png:
        plot(rows, args.png)


if __name__ == "__main__":
    main()
