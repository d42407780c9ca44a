# SPDX-License-Identifier: Apache-2.0
"""What this machine's cost model allows CPP to reach, beside what CPP measured.

    python -m benchmarks.cpp_limits \\
        --measured docs/results/cpp_ttft.json docs/results/cpp_ttft_both_orders.json \\
        --slo docs/results/slo_mixed_avx2_fp32.json --json docs/results/cpp_limits.json

Takes the CPP cost model calibrated on this machine (per stage of the tiny 8-layer Llama at PP=2;
`benchmarks/cpp_ttft.py` calibrates it on first use) and computes, with `vllm_omni.cpp.limits`:

1. Prefill. The best makespan of ANY chunk plan at PP=2 (64-token grid, lower
   bound over all such plans), so the highest speed-up any scheduler could get over plain PP=1
   (2048-token steps) and over plain PP=2 at each fixed chunk size, next to the targets and to
   CPP's measured ratios (from `cpp_ttft.py --json` files: CPP's chunk plans from the paired
   table's step records, the ratios from the last file that has them, so that the order-fair
   `--both-orders` file can follow the paired one). Then the same ceilings under the pipeline
   vLLM 0.32 runs on CPU, whose stages hand a chunk on only when the next one takes it
   (`limits.best_rendezvous_plan`): lower, since every rise of the step time costs there.
2. SLO scheduling (the SLO issue). For step lengths s, the best-case share of short requests
   arriving during a long prefill that meet their TTFT SLO (both of slo_mixed.py's regimes: 3x
   their unloaded TTFT; max(1 s, 5x) for "interactive"), against how much longer the
   long prefills take when every step must fit s; then the best overall attainment any step
   length allows while long prompts stay within 1.3x of solo. Unloaded TTFTs and the share of
   short requests arriving during long prefills come from a `slo_mixed.py --json` file
   (or the flags).

The cost model has no engine round trip, no queued lookahead step, no decode work and no
run-to-run noise, so every figure here is a ceiling, not a prediction.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.limits import (
    best_plan,
    best_rendezvous_plan,
    capped_plan,
    short_ttft_attainment,
    single_stage_ttft,
)
from vllm_omni.cpp.simulator import closed_form_makespan, fixed_chunks, simulate, stage_times

PP = 2
LENGTHS = (8192, 16384, 32768)
FIXED = (256, 512, 1024, 2048, 4096)
HANDOFF_GRID = 128  # vLLM's KV block on CPU, to which CPP aligns its chunks
TARGETS = {"vs_pp1": 1.90, "vs_best_fixed": 1.03, "vs_2048_at_16k": 1.15}
MEASURED_KEYS = {"vs_pp1": "cpp_vs_pp1", "vs_best_fixed": "cpp_vs_best_fixed"}
STEP_LENGTHS_MS = (20, 25, 30, 35, 40, 45, 50, 55, 60, 75, 100, 150, 200, 300, 400, 500, 750, 1000)
# slo_mixed.py's regimes: a short request's TTFT SLO is max(floor, factor x its unloaded TTFT).
REGIMES = {"3x": (3.0, 0.0), "interactive": (5.0, 1.0)}
# Unloaded short-request TTFTs (CPP+SLO server, slo_mixed.py) for --slo files that lack them.
DEFAULT_UNLOADED_TTFT_MS = (28.8, 45.6, 58.4, 61.6)


def default_cost_model_path() -> Path:
    import torch

    from vllm_omni.cpp.cost_model_source import calibration_path
    from vllm_omni.platform.cpu_dtype import resolved_on_this_cpu
    from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

    model = str(build_tiny_models(default_models_dir(), ["llama-8l"])["llama-8l"])
    # The dtype the benchmarks' engines run in (dtype auto on this CPU).
    return calibration_path(model, PP, str(resolved_on_this_cpu(torch.bfloat16)), "cpu")


def merge_measured(files: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Step records of every file; the ratios of the last file that has any."""
    if not files:
        return None
    ratios = next((f["ratios"] for f in reversed(files) if f.get("ratios")), {})
    return {"records": [r for f in files for r in f.get("records", [])], "ratios": ratios}


def prefill_ceilings(cost_model: CostModel, measured: dict[str, Any] | None) -> dict[str, Any]:
    measured_chunks = {}
    if measured:
        for record in measured.get("records", []):
            if record["name"].startswith("CPP"):
                measured_chunks[record["prompt_len"]] = record["chunks"]
    out: dict[str, Any] = {}
    print(f"prefill at PP={PP}, cost model per stage: {cost_model}")
    print(
        f"  {'tokens':>6s} {'best plan s':>11s} {'m':>3s} {'CPP plan':>8s}  "
        f"{'ceiling vs PP=1':>15s} {'vs best fixed':>13s} {'vs 2048':>7s}   measured CPP"
    )
    for n in LENGTHS:
        bound = best_plan(n, cost_model, PP)
        fixed = {c: closed_form_makespan(fixed_chunks(n, c), cost_model, PP) for c in FIXED}
        best_fixed = min(fixed, key=fixed.get)
        row = {
            "best_makespan_s": bound.makespan,
            "lower_bound_s": bound.lower_bound,
            "best_chunks": list(bound.chunks),
            "pp1_s": single_stage_ttft(n, cost_model, 2048, PP),
            "fixed_s": {str(c): t for c, t in fixed.items()},
            "best_fixed": best_fixed,
        }
        row["ceiling_vs_pp1"] = row["pp1_s"] / bound.lower_bound
        row["ceiling_vs_best_fixed"] = fixed[best_fixed] / bound.lower_bound
        row["ceiling_vs_2048"] = fixed[2048] / bound.lower_bound
        if n in measured_chunks:
            row["cpp_plan_over_best"] = (
                closed_form_makespan(measured_chunks[n], cost_model, PP) / bound.makespan
            )
        ratios = (measured or {}).get("ratios", {}).get(str(n))
        if ratios:
            row["measured"] = {
                "vs_pp1": ratios["cpp_vs_pp1"],
                "vs_best_fixed": ratios["cpp_vs_best_fixed"],
                "vs_2048": ratios.get("cpp_vs_default_2048"),
            }
        cpp_plan = row.get("cpp_plan_over_best")
        seen = row.get("measured")
        print(
            f"  {n:6d} {bound.makespan:11.3f} {len(bound.chunks):3d} "
            f"{'' if cpp_plan is None else f'{cpp_plan:7.3f}x':>8s}  "
            f"{row['ceiling_vs_pp1']:14.3f}x {row['ceiling_vs_best_fixed']:12.3f}x "
            f"{row['ceiling_vs_2048']:6.3f}x   "
            + (
                f"{seen['vs_pp1']:.2f}x / {seen['vs_best_fixed']:.3f}x / {seen['vs_2048']:.3f}x"
                if seen
                else "-"
            )
        )
        out[str(n)] = row
    print(
        "  targets: {vs_pp1}x vs PP=1 (16K, 32K), {vs_best_fixed}x vs best fixed (16K, 32K), "
        "{vs_2048_at_16k}x vs 2048 at 16K".format(**TARGETS)
    )
    print(
        f"with vLLM's rendezvous hand-off between the stages ({HANDOFF_GRID}-token chunks, "
        "exact): best plan, ceiling vs best fixed, vs 2048"
    )
    for n in LENGTHS:
        best, chunks = best_rendezvous_plan(n, cost_model, HANDOFF_GRID)
        fixed = {
            c: simulate(fixed_chunks(n, c), cost_model, PP, rendezvous=True).makespan for c in FIXED
        }
        row = out[str(n)]["rendezvous"] = {
            "best_makespan_s": best,
            "best_chunks": list(chunks),
            "fixed_s": {str(c): t for c, t in fixed.items()},
            "ceiling_vs_best_fixed": min(fixed.values()) / best,
            "ceiling_vs_2048": fixed[2048] / best,
        }
        print(
            f"  {n:6d} {best:11.3f} {len(chunks):3d}  {row['ceiling_vs_best_fixed']:.3f}x "
            f"{row['ceiling_vs_2048']:.3f}x"
        )
    return out


def slo_ceilings(
    cost_model: CostModel,
    unloaded_s: list[float],
    during_long: float,
    longs: list[int],
    max_long_ratio: float,
    regime: str = "3x",
) -> dict[str, Any]:
    slo_factor, slo_floor_s = REGIMES[regime]
    solo = {n: best_plan(n, cost_model, PP).makespan for n in longs}
    rows = []
    print(
        f"\nSLO scheduling, {regime} regime: short requests' unloaded TTFT "
        f"{[round(u * 1e3, 1) for u in unloaded_s]} ms, {during_long:.0%} of them arriving "
        "during a long prefill"
    )
    print(
        f"  {'step ms':>7s} {'short ok during long':>20s} {'short ok overall':>16s}   "
        + "  ".join(f"{n // 1024:>3d}K/solo" for n in longs)
    )
    for step_ms in STEP_LENGTHS_MS:
        step = step_ms / 1000
        during = short_ttft_attainment(step, unloaded_s, slo_factor, slo_floor_s)
        ratios = {}
        for n in longs:
            chunks = capped_plan(n, cost_model, step)
            fits = max(stage_times(chunks, cost_model)) <= step * (1 + 1e-9)
            ratios[str(n)] = (
                closed_form_makespan(chunks, cost_model, PP) / solo[n] if fits else None
            )
        row = {
            "step_ms": step_ms,
            "short_ok_during_long": during,
            "short_ok_overall": 1 - during_long + during_long * during,
            "long_over_solo": ratios,
        }
        rows.append(row)
        print(
            f"  {step_ms:7d} {during:20.0%} {row['short_ok_overall']:16.0%}   "
            + "  ".join("  no fit" if r is None else f"{r:7.2f}x" for r in ratios.values())
        )
    allowed = [
        r
        for r in rows
        if all(v is not None and v <= max_long_ratio for v in r["long_over_solo"].values())
    ]
    best = max(allowed, key=lambda r: r["short_ok_overall"], default=None)
    if best:
        print(
            f"  best with every long prompt within {max_long_ratio}x of solo: steps of "
            f"{best['step_ms']} ms, {best['short_ok_overall']:.0%} of short requests within SLO "
            "(target 95%)"
        )
    return {
        "regime": regime,
        "unloaded_ttft_s": unloaded_s,
        "during_long": during_long,
        "rows": rows,
        "best_within_long_limit": best,
    }


def slo_inputs(
    path: Path | None, unloaded_ms: str | None, during: float | None, regime: str = "3x"
):
    unloaded = [float(x) / 1000 for x in unloaded_ms.split(",")] if unloaded_ms else None
    if path:
        data = json.loads(path.read_text())
        data = data.get(regime, data)  # slo_mixed.py files keyed by SLO regime, or older ones
        runs = data.get("CPP+SLO", {})
        counts = [(r["num_short_during_long"], r["num_short"]) for r in runs.values()]
        if during is None and counts:
            during = sum(a for a, _ in counts) / sum(b for _, b in counts)
        saved = [r["unloaded_ttft_s"] for r in runs.values() if "unloaded_ttft_s" in r]
        if unloaded is None and saved:
            unloaded = [float(t) for t in saved[0].values()]
    unloaded = unloaded or [u / 1000 for u in DEFAULT_UNLOADED_TTFT_MS]
    return unloaded, 0.5 if during is None else during


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost-model", type=Path, default=None, help="default: this machine's")
    parser.add_argument(
        "--measured", type=Path, nargs="+", default=[], help="cpp_ttft.py --json outputs"
    )
    parser.add_argument("--slo", type=Path, default=None, help="slo_mixed.py --json output")
    parser.add_argument("--unloaded-ttft-ms", default=None, help="comma-separated, overrides --slo")
    parser.add_argument("--during-long", type=float, default=None, help="overrides --slo")
    parser.add_argument("--longs", default="16384,24576,32768")
    parser.add_argument("--max-long-ratio", type=float, default=1.3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    path = args.cost_model or default_cost_model_path()
    if not path.is_file():
        raise SystemExit(
            f"no cost model at {path}: run python -m benchmarks.cpp_ttft (or python -m "
            "vllm_omni.cpp.calibrate <tiny llama-8l> -pp 2) first"
        )
    cost_model = CostModel.load(path)
    measured = merge_measured([json.loads(p.read_text()) for p in args.measured])
    result = {
        "cost_model": cost_model.to_dict(),
        "pp": PP,
        "targets": TARGETS,
        "prefill": prefill_ceilings(cost_model, measured),
        "slo": {
            regime: slo_ceilings(
                cost_model,
                *slo_inputs(args.slo, args.unloaded_ttft_ms, args.during_long, regime),
                [int(x) for x in args.longs.split(",")],
                args.max_long_ratio,
                regime,
            )
            for regime in REGIMES
        },
    }
    write_result(args.json, result)


if __name__ == "__main__":
    main()
