# SPDX-License-Identifier: Apache-2.0
"""CPP on a model it has never seen: online calibration from an empty cache, against plain vLLM.

    python -m benchmarks.cpp_fresh --offline-check --json docs/results/cpp_fresh_<machine>.json

Builds a Llama of a shape no calibration exists for (`SHAPE`, random weights, seconds to build),
points the calibration cache at an empty folder, and runs `cpp_ttft.run_both_orders`: each plain
PP=2 fixed-chunk baseline against a fresh CPP engine, the pair started in both orders, prompts of
each length alternating between the two engines (one warm-up, then --runs timed, medians; ratios
are baseline TTFT / CPP TTFT, > 1: CPP faster, geometric mean of the two orders). Nothing is
calibrated by hand: the first CPP engine starts from the analytic FLOP model and fits its cost
model to the steps it runs; later engines start from that fit (cached) and go
on fitting. Reported besides the table:

- the first long prompt: the first CPP engine's first prompt (planned with the analytic model,
  exploring) against the baseline engine's first prompt of the same length;
- the fit: its coefficients, and how well it predicts the step times of every timed CPP prefill
  (relative RMS error against the slowest and the last rank's busy time per step), beside how
  much the two ranks' busy times for the same step differ (the machine's noise floor);
- per rank, the idle time between steps beside the busy time, for CPP and each baseline, and
  how well a free-flowing pipeline and vLLM's rendezvous hand-off between the ranks explain the
  measured TTFTs from those busy times;
- what the fit allows under that hand-off: the best plan of any scheduler, CPP's plan and the
  fixed chunks (`limits.best_rendezvous_plan`);
- with --offline-check, the offline calibration (`python -m vllm_omni.cpp.calibrate`) of the same
  model, run afterwards: the plan CPP cuts with the online fit against the plan it cuts with the
  offline one, both costed by the offline model (1.00: the same plan's time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from benchmarks.cpp_ttft import CPP_NAME, PLAIN_PP2, auto_dtype, configs, run_both_orders

SHAPE = dict(
    architecture="llama", num_layers=4, hidden_size=128, num_heads=2, num_kv_heads=1,
    intermediate_size=384, max_position_embeddings=65536, rope_theta=1_000_000.0, seed=2001,
)  # fmt: skip
"""Not a shape of the tiny-model builder: no calibration of it exists anywhere."""


def build_model(folder: Path) -> str:
    from vllm_omni.models.plain_lm.tiny import TinyLMConfig, build_lm

    if not (folder / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        build_lm(TinyLMConfig(**SHAPE), folder)
    return str(folder)


def prediction_error(cost_model, records: list[list[list[dict]]]) -> dict[str, Any]:
    """Relative RMS error of the model's step times against the slowest rank's busy times (what
    `calibrate` fits) and the last rank's (what the online fit sees), and the noise floor: how
    far the two ranks' busy times for the same step differ (the same work on each)."""

    def rms(values: list[float]) -> float:
        return math.sqrt(sum(v * v for v in values) / len(values))

    slowest, last, ranks = [], [], []
    for per_rank in records:
        for step in zip(*per_rank):
            chunks = [tuple(c) for c in step[0]["chunks"]]
            predicted = cost_model.step_cost(chunks)
            busy = [r["end_s"] - r["start_s"] for r in step]
            slowest.append(predicted / max(busy) - 1)
            last.append(predicted / busy[-1] - 1)
            ranks.append((busy[0] - busy[-1]) / (sum(busy) / len(busy)))
    return {
        "steps": len(slowest),
        "rel_rmse": rms(slowest),
        "median_rel_error": statistics.median(slowest),
        "rel_rmse_last_rank": rms(last),
        "median_rel_error_last_rank": statistics.median(last),
        "rank_disagreement_rms": rms(ranks),
    }


def step_gaps(records: list[list[list[dict]]]) -> dict[str, Any]:
    """Where a prefill's time goes besides compute, per rank, medians over the prefills: idle
    seconds between its steps (dispatch, the receive, waiting for the other rank), the median
    gap, the steps, and rank 0's first step (nothing to overlap with)."""
    per_rank: list[dict[str, list[float]]] = []
    for prefill in records:
        for rank, steps in enumerate(prefill):
            if rank == len(per_rank):
                per_rank.append({"idle_s": [], "median_gap_ms": [], "busy_s": [], "steps": []})
            gaps = [b["start_s"] - a["end_s"] for a, b in zip(steps, steps[1:])]
            stats = per_rank[rank]
            stats["idle_s"].append(sum(gaps))
            stats["median_gap_ms"].append(1e3 * statistics.median(gaps) if gaps else 0.0)
            stats["busy_s"].append(sum(r["end_s"] - r["start_s"] for r in steps))
            stats["steps"].append(len(steps))
    first = [p[0][0]["end_s"] - p[0][0]["start_s"] for p in records if p and p[0]]
    return {
        "prefills": len(records),
        "first_step_s": statistics.median(first) if first else None,
        "ranks": [{k: statistics.median(v) for k, v in stats.items()} for stats in per_rank],
    }


def handoff_check(records: list[list[list[dict]]], ttfts: list[float]) -> dict[str, float]:
    """How well two pipeline models explain the measured TTFTs from the measured per-rank busy
    times of the same prefills (two ranks): free-flowing buffers between the stages, and the
    rendezvous hand-off of vLLM's CPU pipeline (`simulator.simulate(rendezvous=True)`).
    Median of predicted / measured TTFT over the prefills."""
    ratios: dict[str, list[float]] = {"buffered": [], "rendezvous": []}
    for prefill, ttft in zip(records, ttfts):
        first, second = ([r["end_s"] - r["start_s"] for r in rank] for rank in prefill)
        for model, out in ratios.items():
            start0, start1, end1 = 0.0, 0.0, 0.0
            for i, (d0, d1) in enumerate(zip(first, second)):
                if i:  # rank 0 is free once it finished (buffered) or once rank 1 took it
                    start0 = start1 if model == "rendezvous" else start0 + first[i - 1]
                start1 = max(start0 + d0, end1)
                end1 = start1 + d1
            out.append(end1 / ttft)
    return {k: statistics.median(v) for k, v in ratios.items()}


def ceiling(cost_model, lengths, chunks: list[int], block_size: int) -> dict[str, Any]:
    """Under `cost_model` and vLLM's rendezvous pipeline (two stages): the best plan of
    block-sized chunks any scheduler could cut, CPP's plan and the fixed chunks; speed-ups of
    the best plan and of CPP's over the best fixed chunk."""
    from vllm_omni.cpp.chunking import cpp_plan
    from vllm_omni.cpp.limits import best_rendezvous_plan
    from vllm_omni.cpp.simulator import fixed_chunks, simulate

    out = {}
    for n in lengths:
        best, plan = best_rendezvous_plan(n, cost_model, block_size)
        cpp = simulate(cpp_plan(cost_model, n, 2, block_size), cost_model, 2, rendezvous=True)
        fixed = {
            c: simulate(fixed_chunks(n, c), cost_model, 2, rendezvous=True).makespan for c in chunks
        }
        best_fixed = min(fixed.values())
        out[str(n)] = {
            "best_plan_s": best,
            "best_plan_chunks": len(plan),
            "cpp_plan_s": cpp.makespan,
            "fixed_s": {str(c): t for c, t in fixed.items()},
            "best_plan_vs_best_fixed": best_fixed / best,
            "cpp_plan_vs_best_fixed": best_fixed / cpp.makespan,
        }
        print(
            f"  {n:6d} tokens: best plan {best:.3f} s ({len(plan)} chunks), CPP's plan "
            f"{cpp.makespan:.3f} s, fixed "
            + ", ".join(f"{c}: {t:.3f} s" for c, t in fixed.items())
            + f"; vs the best fixed chunk: best plan {best_fixed / best:.4f}, CPP "
            f"{best_fixed / cpp.makespan:.4f}"
        )
    return out


def plan_check(online, offline, lengths, block_size: int) -> dict[str, Any]:
    """The online fit's CPP plan against the offline calibration's, costed by the offline model."""
    from vllm_omni.cpp.chunking import cpp_plan
    from vllm_omni.cpp.simulator import closed_form_makespan

    out = {}
    for n in lengths:
        plans = {
            name: cpp_plan(m, n, 2, block_size)
            for name, m in (("online", online), ("offline", offline))
        }
        times = {k: closed_form_makespan(p, offline, 2) for k, p in plans.items()}
        ratio = times["online"] / times["offline"]
        out[str(n)] = {
            "chunks": {k: len(p) for k, p in plans.items()},
            "online_over_offline": ratio,
        }
        print(
            f"  {n:6d} tokens: online plan {len(plans['online'])} chunks, offline plan "
            f"{len(plans['offline'])} chunks; plan time online / offline: {ratio:.4f}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--chunks", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--offline-check", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--records", type=Path, default=None, help="also write every timed prefill's step records"
    )
    args = parser.parse_args()

    from vllm_omni.cpp.cost_model import CostModel
    from vllm_omni.cpp.cost_model_source import CACHE_ENV, calibration_dir

    work = Path(tempfile.mkdtemp(prefix="vllm_omni-cpp-fresh-"))
    os.environ[CACHE_ENV] = str(work / "cache")  # empty: nothing calibrated; engines inherit it
    model = build_model(work / "model")
    print(f"model {model} ({SHAPE}); calibration cache {calibration_dir()} (empty)", flush=True)

    model_len = max(args.lengths) + 64
    all_configs = configs(tuple(args.chunks), model_len)
    baselines = [c for c in all_configs if c.name.startswith(PLAIN_PP2)]
    cpp_config = next(c for c in all_configs if c.name == CPP_NAME)
    result: dict[str, Any] = {}
    result["pairs"] = run_both_orders(
        baselines, cpp_config, model, args.lengths, args.runs, trace=result
    )

    (cached,) = calibration_dir().glob("*.json")
    online, fit = CostModel.load_with_fit(cached)
    error = prediction_error(online, result["records"][CPP_NAME])
    print(f"\nonline fit ({fit}): {online}")
    print(
        f"its prediction of the {error['steps']} timed CPP steps: relative RMS error "
        f"{error['rel_rmse']:.1%} (median {error['median_rel_error']:+.1%}) against the slowest "
        f"rank, {error['rel_rmse_last_rank']:.1%} (median "
        f"{error['median_rel_error_last_rank']:+.1%}) against the last rank; the two ranks' busy "
        f"times for the same step differ by {error['rank_disagreement_rms']:.1%} RMS"
    )
    first = result["first_prompt"]
    base_first, cpp_first = (first["ttft_s"][k] for k in (first["baseline"], CPP_NAME))
    print(
        f"first {first['prompt_len']}-token prompt: {first['baseline']} {base_first:.3f} s, "
        f"CPP (analytic model, exploring) {cpp_first:.3f} s = {base_first / cpp_first:.3f}"
    )
    gaps = {name: step_gaps(r) for name, r in result["records"].items()}
    print("\nper-rank time besides compute (medians over the timed prefills of all lengths):")
    for name, g in gaps.items():
        ranks = "; ".join(
            f"rank {i}: busy {r['busy_s']:.2f} s, idle {r['idle_s']:.3f} s over {r['steps']:.0f} "
            f"steps (median gap {r['median_gap_ms']:.2f} ms)"
            for i, r in enumerate(g["ranks"])
        )
        print(f"  {name:24s} first step {g['first_step_s']:.3f} s; {ranks}")
    handoff = {
        name: handoff_check(result["records"][name], result["ttft_s"][name])
        for name in result["records"]
    }
    print("\nTTFT predicted from the measured busy times / measured (medians):")
    for name, h in handoff.items():
        print(
            f"  {name:24s} free-flowing pipeline {h['buffered']:.3f}, "
            f"rendezvous hand-off {h['rendezvous']:.3f}"
        )
    block = 128  # vLLM's KV block on CPU, CPP's chunk alignment
    print("\nwhat the online fit allows, under the rendezvous hand-off:")
    limits = ceiling(online, args.lengths, args.chunks, block)
    ratios: dict[str, Any] = {}
    print("\nsteady state, both orders: baseline TTFT / CPP TTFT (> 1: CPP faster)")
    for n in args.lengths:
        row = {name: r[str(n)]["both_orders"] for name, r in result["pairs"].items()}
        best = min(row, key=row.get)
        ratios[str(n)] = {
            **row,
            "cpp_vs_best_fixed": row[best],
            "best_fixed": best,
            "cpp_vs_default_2048": row.get(f"{PLAIN_PP2} chunk 2048"),
        }
        print(f"  {n:6d} tokens: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
        print(f"  {'':6s}  CPP vs the best fixed chunk ({best}): {row[best]:.3f}")

    out: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count()},
        "shape": SHAPE,
        "ratios": ratios,
        "first_prompt": first,
        "online_fit": {"model": online.to_dict(), "fit": fit, "prediction": error},
        "pairs": result["pairs"],
        "step_gaps": gaps,
        "handoff_check": handoff,
        "ceiling_online_fit": limits,
    }
    if args.offline_check:
        from vllm_omni.cpp.calibrate import calibrate

        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
        print("\noffline calibration of the same model, for comparison:", flush=True)
        offline = calibrate(model, 2, save=False, max_context=max(args.lengths)).model
        chunks = [sum(x for x, _ in r[0]["chunks"]) for r in result["records"][CPP_NAME][-1]]
        block = math.gcd(*chunks[:-1]) if len(chunks) > 2 else 128
        out["offline"] = {
            "model": offline.to_dict(),
            "prediction": prediction_error(offline, result["records"][CPP_NAME]),
            "plans": plan_check(online, offline, args.lengths, block),
        }
        print(
            f"offline: {offline}; predicts the timed CPP steps within "
            f"{out['offline']['prediction']['rel_rmse']:.1%} relative RMS"
        )
    if args.records:
        records = {"ttft_s": result["ttft_s"], "records": result["records"]}
        args.records.write_text(json.dumps(records))
    write_result(args.json, out, dtype=auto_dtype())


if __name__ == "__main__":
    main()
