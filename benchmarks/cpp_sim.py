# SPDX-License-Identifier: Apache-2.0
"""Simulated pipeline bubble of chunked prefill (CPP), projected to large models and long contexts,
and checked against measured TTFTs.

    python -m benchmarks.cpp_sim                         # projection table (seconds)
    python -m benchmarks.cpp_sim --json out/cpp_sim.json --plot out/cpp_sim.png
    python -m benchmarks.cpp_sim --measured out/cpp_ttft.json   # + validation table

(a) Projection: Llama-3-8B / 70B shapes, analytic per-stage FLOP cost model, p in {4, 8, 16},
    128K..1M-token prompts. Fixed 4096-token chunks vs compute-balanced chunks (plan_chunks with
    the budget of a 16K first chunk), vs balanced chunks at the fixed plan's step count ("same m",
    the papers.md A13 comparison), and, when steps cost something, the CPP scheduler's own plan
    (m* = optimal_num_steps). Step overhead 0 and an overhead of --overhead-ms at --tflops.
(b) Validation: simulated vs measured TTFT per configuration of benchmarks/cpp_ttft.py's JSON.
(c) --plot: bubble vs p at 1M tokens, fixed vs balanced chunks.
No engine is started; everything here is arithmetic on vllm_omni.cpp.simulator.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from vllm_omni.cpp.chunking import budget_for_chunk, optimal_num_steps, plan_chunks
from vllm_omni.cpp.cost_model import CostModel, ModelShape
from vllm_omni.cpp.simulator import SimResult, fixed_chunks, simulate

K = 1024
SHAPES = {"llama3-8b": ModelShape.llama3_8b(), "llama3-70b": ModelShape.llama3_70b()}
# papers.md A13 (Llama-3-8B, FLOP-proportional time, c = 0): bubble % of fixed 4096-token chunks,
# its ideal (p-1)/(m+p-1), and equal-FLOP chunks (first chunk 16K) at 1M tokens.
A13_FIXED = {
    (128 * K, 4): 13.7,
    (128 * K, 8): 27.0,
    (128 * K, 16): 44.2,
    (1024 * K, 4): 2.2,
    (1024 * K, 8): 5.1,
    (1024 * K, 16): 10.2,
}
A13_IDEAL = {
    (128 * K, 4): 8.6,
    (128 * K, 8): 17.9,
    (128 * K, 16): 31.9,
    (1024 * K, 4): 1.2,
    (1024 * K, 8): 2.7,
    (1024 * K, 16): 5.5,
}
A13_BALANCED_1M = {4: 0.3, 8: 0.7, 16: 1.5}
A13_IDLE_REMOVED = {128 * K: 41.0, 1024 * K: 49.0}
A13_70B_FIXED = {(1024 * K, 8): 5.0}  # Llama-3-70B at 1M, p = 8 (imbalance 1.91)


# ----------------------------------------------------------------------------- (a) projection


def _plan_same_m(prompt_len: int, cost_model: CostModel, num_steps: int, block: int) -> list[int]:
    """Equal-cost chunks aiming at `num_steps` steps: budget = total cost / num_steps."""
    budget = cost_model.chunk_cost(prompt_len, 0) / num_steps
    return plan_chunks(prompt_len, cost_model, budget, block_size=block)


def _variant(
    name: str, chunks: list[int], cost_model: CostModel, pp: int, fixed: SimResult | None
) -> tuple[dict[str, Any], SimResult]:
    """Summary of simulating `chunks`; idle removed and speed-up are relative to `fixed`."""
    res = simulate(chunks, cost_model, pp)
    # vLLM keeps at most pp steps in flight: chunk i + pp waits for chunk i to leave the pipeline.
    windowed = simulate(chunks, cost_model, pp, max_in_flight=pp)
    out = {
        "variant": name,
        "m": res.num_chunks,
        # The smallest chunk before the remainder: how far balancing shrinks chunks.
        "min_chunk": min(chunks[:-1] or chunks),
        "max_chunk": max(chunks),
        "last_chunk": chunks[-1],
        "bubble": res.bubble,
        "bubble_window_p": windowed.bubble,
        "ideal_bubble": res.ideal_bubble,
        "imbalance": max(res.stage_times) / (sum(res.stage_times) / res.num_chunks),
        "makespan": res.makespan,
        "idle": res.idle,
    }
    if fixed is not None:
        # Absolute idle stage-time removed, and prefill speed-up, relative to fixed chunks.
        out["idle_removed"] = 1.0 - res.idle / fixed.idle if fixed.idle > 0 else 0.0
        out["speedup"] = fixed.makespan / res.makespan
    return out, res


def projection(
    shape_name: str,
    pp: int,
    prompt_len: int,
    overhead: float,
    fixed_chunk: int,
    first_chunk: int,
    block: int,
) -> dict[str, Any]:
    """All chunking variants of one (model, p, prompt, overhead) point; FLOP units."""
    analytic = CostModel.analytic(SHAPES[shape_name], pp)
    cost_model = CostModel(analytic.linear, analytic.attention, overhead, "flop")
    row: dict[str, Any] = {
        "model": shape_name,
        "pp": pp,
        "prompt_len": prompt_len,
        "step_overhead_flop": overhead,
    }
    fixed, fixed_res = _variant(
        "fixed", fixed_chunks(prompt_len, fixed_chunk), cost_model, pp, None
    )
    row["fixed"] = fixed
    balanced = plan_chunks(
        prompt_len, cost_model, budget_for_chunk(cost_model, first_chunk), block_size=block
    )
    row["balanced"] = _variant("balanced", balanced, cost_model, pp, fixed_res)[0]
    row["same_m"] = _variant(
        "same_m", _plan_same_m(prompt_len, cost_model, fixed["m"], block), cost_model, pp, fixed_res
    )[0]
    if overhead > 0:
        # The CPP scheduler's own choice: m* minimising (m + p - 1) * (T / m + c).
        total = cost_model.chunk_cost(prompt_len, 0)
        m_star = optimal_num_steps(total, overhead, pp, max_steps=math.ceil(prompt_len / block))
        row["sched"] = _variant(
            "sched", _plan_same_m(prompt_len, cost_model, m_star, block), cost_model, pp, fixed_res
        )[0]
        row["sched"]["m_star"] = m_star
    return row


def _pct(x: float | None, width: int = 6, digits: int = 1) -> str:
    return f"{'-':>{width}s}" if x is None else f"{100 * x:{width}.{digits}f}"


def _a13_refs(model: str, overhead: float, prompt_len: int, pp: int) -> dict[str, float | None]:
    """papers.md A13 numbers for this point (all None where A13 has none, e.g. with c > 0)."""
    key, c0 = (prompt_len, pp), overhead == 0
    is_8b = c0 and model == "llama3-8b"
    return {
        "fixed": (A13_FIXED if is_8b else A13_70B_FIXED if c0 else {}).get(key),
        "ideal": A13_IDEAL.get(key) if is_8b else None,
        "balanced": A13_BALANCED_1M.get(pp) if is_8b and prompt_len == 1024 * K else None,
        "idle_removed": A13_IDLE_REMOVED.get(prompt_len) if is_8b else None,
    }


def _a13(value: float | None) -> str:
    return f"{'':>5s}" if value is None else f"{value:5.1f}"


def print_projection(rows: list[dict[str, Any]], overhead_ms: float) -> None:
    """One block per (model, overhead); bubbles and idle removed in %."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["step_overhead_flop"]), []).append(row)
    for (model, overhead), block_rows in groups.items():
        label = "c = 0" if overhead == 0 else f"c = {overhead:.2e} FLOP/step ({overhead_ms:g} ms)"
        has_sched = overhead > 0
        print(
            f"\n{model}, per-stage FLOP model, {label}. Bubble %; 'A13' = papers.md; "
            "'idle-' = share of fixed chunks' idle time removed; "
            "'W=p' = at most p chunks in flight, as vLLM's batch queue"
        )
        head = (
            f"{'p':>3s} {'ctx':>5s} | {'fixed 4096':^37s} | {'balanced (16K first)':^50s} |"
            f" {'same m':^19s} |"
        )
        sub = (
            f"{'':>3s} {'':>5s} | {'m':>4s} {'max/mn':>6s} {'bubble':>6s} {'ideal':>5s} "
            f"{'A13':>5s} {'A13id':>5s} | {'m':>4s} {'min':>5s} {'last':>5s} {'bubble':>6s} "
            f"{'W=p':>6s} {'A13':>5s} {'idle-':>5s} {'speedup':>7s} | "
            f"{'bubble':>6s} {'idle-':>5s} {'A13':>5s} |"
        )
        if has_sched:
            head += f" {'CPP sched (m*)':^33s}"
            sub += f" {'m*':>4s} {'m':>4s} {'bubble':>6s} {'W=p':>6s} {'speedup':>7s}"
        print(head)
        print(sub)
        for row in block_rows:
            ref = _a13_refs(model, overhead, row["prompt_len"], row["pp"])
            f, b, s = row["fixed"], row["balanced"], row["same_m"]
            line = (
                f"{row['pp']:3d} {row['prompt_len'] // K:4d}K | "
                f"{f['m']:4d} {f['imbalance']:6.2f} {_pct(f['bubble'])} "
                f"{_pct(f['ideal_bubble'], 5)} {_a13(ref['fixed'])} {_a13(ref['ideal'])} | "
                f"{b['m']:4d} {b['min_chunk']:5d} {b['last_chunk']:5d} "
                f"{_pct(b['bubble'], 6, 2)} {_pct(b['bubble_window_p'], 6, 2)} "
                f"{_a13(ref['balanced'])} {_pct(b['idle_removed'], 5, 0)} "
                f"{b['speedup']:7.3f} | "
                f"{_pct(s['bubble'])} {_pct(s['idle_removed'], 5, 0)} "
                f"{_a13(ref['idle_removed'])} |"
            )
            if has_sched:
                c = row["sched"]
                line += (
                    f" {c['m_star']:4d} {c['m']:4d} {_pct(c['bubble'], 6, 2)} "
                    f"{_pct(c['bubble_window_p'], 6, 2)} {c['speedup']:7.3f}"
                )
            print(line)


# ----------------------------------------------------------------------------- (b) validation


def _as_cost_model(value: Any, base: Path | None) -> CostModel:
    """A CostModel from a to_dict() mapping or a JSON path (relative to `base`'s folder)."""
    if isinstance(value, Mapping):
        return CostModel.from_dict(value)
    if isinstance(value, str):
        path = Path(value)
        if not path.is_absolute() and base is not None and not path.exists():
            path = base.parent / path
        return CostModel.load(path)
    raise ValueError(f"cost_model must be a mapping or a path, got {type(value).__name__}")


def rescale(cost_model: CostModel, from_pp: int, to_pp: int) -> CostModel:
    """Per-stage model calibrated at `from_pp` stages applied to `to_pp`: token costs scale with
    the layers per stage (~1/pp); the step overhead (launch, sampling, scheduling) is kept."""
    factor = from_pp / to_pp
    return CostModel(
        cost_model.linear * factor,
        cost_model.attention * factor,
        cost_model.step_overhead,
        cost_model.unit,
    )


def load_measured(
    path: Path, cost_model: CostModel | None = None, cost_model_pp: int | None = None
) -> list[dict[str, Any]]:
    """Records of a cpp_ttft.py JSON, each with the per-stage CostModel to simulate it with.

    Accepted: {"records": [...], "cost_model": {...} | "path.json", "cost_model_pp": int} or a
    bare list of records. A record is {"name", "pp", "prompt_len", "chunks": [int], "ttft_s"},
    optionally "start" (cached tokens) and its own "cost_model". Precedence of cost models:
    `cost_model` argument (--cost-model), the record's, the file's. When the file says at which
    pp its model was calibrated (or `cost_model_pp` is given), records at another pp use
    `rescale`d models ("scaled" in the output).
    """
    data = json.loads(Path(path).read_text())
    top: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
    records = data if isinstance(data, list) else top.get("records", top.get("results"))
    if not isinstance(records, list) or not records:
        raise ValueError(f"{path}: no records (expected a list, or an object with 'records')")
    file_model = top.get("cost_model")
    calibrated_pp = cost_model_pp or top.get("cost_model_pp")
    out = []
    for i, rec in enumerate(records):
        for key in ("pp", "prompt_len", "chunks", "ttft_s"):
            if key not in rec:
                raise ValueError(f"{path}: record {i} ({rec.get('name', '?')}) lacks {key!r}")
        source = cost_model or rec.get("cost_model") or file_model
        if source is None:
            raise ValueError(f"{path}: no cost model for record {i}; pass --cost-model")
        model = source if isinstance(source, CostModel) else _as_cost_model(source, Path(path))
        scaled = bool(calibrated_pp) and rec["pp"] != calibrated_pp
        if scaled:
            model = rescale(model, calibrated_pp, rec["pp"])
        start = int(rec.get("start", 0))
        if start + sum(rec["chunks"]) != rec["prompt_len"]:
            print(
                f"warning: record {rec.get('name', i)}: chunks sum to "
                f"{sum(rec['chunks'])}, prompt_len - start is {rec['prompt_len'] - start}"
            )
        out.append(
            {
                "name": rec.get("name", f"record {i}"),
                "pp": int(rec["pp"]),
                "prompt_len": int(rec["prompt_len"]),
                "chunks": [int(x) for x in rec["chunks"]],
                "ttft_s": float(rec["ttft_s"]),
                "start": start,
                "cost_model": model,
                "scaled": scaled,
            }
        )
    return out


def validate(
    records: list[dict[str, Any]], comm_s: float = 0.0, window: bool = True
) -> list[dict[str, Any]]:
    """Simulated prefill makespan vs measured TTFT per record (seconds). window: cap chunks in
    flight at pp, as vLLM's batch queue does."""
    rows = []
    for rec in records:
        res = simulate(
            rec["chunks"],
            rec["cost_model"],
            rec["pp"],
            start=rec["start"],
            comm_s=comm_s,
            max_in_flight=rec["pp"] if window else None,
        )
        rows.append(
            {
                "name": rec["name"],
                "pp": rec["pp"],
                "prompt_len": rec["prompt_len"],
                "m": len(rec["chunks"]),
                "scaled": rec["scaled"],
                "ttft_s": rec["ttft_s"],
                "sim_s": res.makespan,
                "sim_bubble": res.bubble,
                "rel_err": res.makespan / rec["ttft_s"] - 1.0,
            }
        )
    return rows


def print_validation(rows: list[dict[str, Any]], tolerance: float) -> None:
    print("\nValidation: simulated prefill makespan vs measured median TTFT (seconds)")
    print(
        f"{'config':28s} {'pp':>2s} {'prompt':>6s} {'m':>4s} {'measured':>8s} {'sim':>8s} "
        f"{'rel err':>7s} {'bubble':>6s}"
    )
    for r in rows:
        flag = "" if abs(r["rel_err"]) <= tolerance else "  <-- off"
        flag += "  (cost model rescaled to this pp)" if r["scaled"] else ""
        print(
            f"{r['name'][:28]:28s} {r['pp']:2d} {r['prompt_len']:6d} {r['m']:4d} "
            f"{r['ttft_s']:8.3f} {r['sim_s']:8.3f} {r['rel_err']:+7.1%} "
            f"{100 * r['sim_bubble']:5.1f}%{flag}"
        )
    errs = [abs(r["rel_err"]) for r in rows]
    within = sum(e <= tolerance for e in errs)
    print(
        f"{within}/{len(rows)} within {tolerance:.0%}; median |rel err| "
        f"{sorted(errs)[len(errs) // 2]:.1%}, max {max(errs):.1%}"
    )


# ----------------------------------------------------------------------------- (c) plot


def bubble_vs_p(
    shape_name: str,
    prompt_len: int,
    overhead: float,
    fixed_chunk: int,
    first_chunk: int,
    block: int,
) -> list[dict[str, Any]]:
    """Bubble per p of fixed and balanced chunks (c = 0), and of the CPP scheduler's plan with
    step overhead `overhead` (FLOP)."""
    shape = SHAPES[shape_name]
    out = []
    for pp in (p for p in (2, 4, 8, 16, 32) if p <= shape.num_layers):
        row = projection(shape_name, pp, prompt_len, 0.0, fixed_chunk, first_chunk, block)
        sched = projection(shape_name, pp, prompt_len, overhead, fixed_chunk, first_chunk, block)
        out.append(
            {
                "pp": pp,
                "fixed": row["fixed"]["bubble"],
                "balanced": row["balanced"]["bubble"],
                "ideal_fixed_m": row["fixed"]["ideal_bubble"],
                "sched_with_overhead": sched["sched"]["bubble"] if overhead > 0 else None,
            }
        )
    return out


def plot(
    curves: dict[str, list[dict[str, Any]]], prompt_len: int, overhead_ms: float, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, points) in enumerate(curves.items()):
        ps = [pt["pp"] for pt in points]
        ax.plot(
            ps,
            [100 * pt["fixed"] for pt in points],
            "o--",
            color=f"C{i}",
            label=f"{label}: fixed 4096",
        )
        ax.plot(
            ps,
            [100 * pt["balanced"] for pt in points],
            "s-",
            color=f"C{i}",
            label=f"{label}: balanced (16K first)",
        )
        if points[0]["sched_with_overhead"] is not None:
            ax.plot(
                ps,
                [100 * pt["sched_with_overhead"] for pt in points],
                "^:",
                color=f"C{i}",
                label=f"{label}: CPP plan m*, c = {overhead_ms:g} ms",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks([2, 4, 8, 16, 32], ["2", "4", "8", "16", "32"])
    ax.set_xlabel("pipeline stages p")
    ax.set_ylabel("simulated bubble (%)")
    ax.set_title(
        f"Prefill bubble at {prompt_len // K}K tokens (analytic FLOP model, c = 0 unless noted)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--pp", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        default=[128, 256, 512, 1024],
        help="prompt lengths in K (1024) tokens",
    )
    parser.add_argument("--fixed-chunk", type=int, default=4096)
    parser.add_argument(
        "--first-chunk",
        type=int,
        default=16384,
        help="balanced plan: budget = cost of this first chunk",
    )
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument(
        "--overhead-ms",
        type=float,
        default=1.0,
        help="per-step overhead for the second table, in ms at --tflops",
    )
    parser.add_argument("--tflops", type=float, default=400.0, help="effective TFLOP/s per stage")
    parser.add_argument(
        "--measured", type=Path, default=None, help="JSON written by benchmarks/cpp_ttft.py"
    )
    parser.add_argument(
        "--cost-model",
        type=Path,
        default=None,
        help="CostModel JSON (per stage) overriding the measured file's",
    )
    parser.add_argument(
        "--cost-model-pp",
        type=int,
        default=None,
        help="pp the cost model was calibrated at (rescales records at other pp)",
    )
    parser.add_argument("--comm-s", type=float, default=0.0, help="validation: P2P send seconds")
    parser.add_argument(
        "--no-window", action="store_true", help="validation: do not cap chunks in flight at pp"
    )
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)

    overhead = args.overhead_ms * 1e-3 * args.tflops * 1e12
    rows = [
        projection(model, pp, ctx * K, c, args.fixed_chunk, args.first_chunk, args.block)
        for model in args.models
        for c in (0.0, overhead)
        for pp in args.pp
        for ctx in args.contexts
    ]
    for row in rows:  # FLOP -> seconds at the assumed throughput, for the JSON reader
        for key in ("fixed", "balanced", "same_m", "sched"):
            if key in row:
                row[key]["makespan_s"] = row[key]["makespan"] / (args.tflops * 1e12)
    print_projection(rows, args.overhead_ms)
    print(
        "\nIdle removed = 1 - idle(variant) / idle(fixed), absolute stage-time; A13 predicts "
        "1 - 1/imbalance for equal-cost chunks at the same m. Balanced plans end with a short "
        "remainder chunk ('last'); its cost is below the budget, so it only adds one step "
        "overhead c."
    )

    target = next(
        (
            r
            for r in rows
            if r["model"] == "llama3-8b"
            and r["pp"] == 8
            and r["prompt_len"] == 1024 * K
            and r["step_overhead_flop"] == 0
        ),
        None,
    )
    if target is not None:
        ok = target["balanced"]["bubble"] <= 0.01
        print(
            f"\nLlama-3-8B, p=8, 1M tokens, balanced chunks: bubble "
            f"{target['balanced']['bubble']:.2%} ({'<=' if ok else '>'} 1%)"
        )

    result: dict[str, Any] = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "step_overhead_flop": overhead,
        "projection": rows,
        "a13_reference": {
            "fixed_bubble_pct": {f"{k[0]}/{k[1]}": v for k, v in A13_FIXED.items()},
            "ideal_pct": {f"{k[0]}/{k[1]}": v for k, v in A13_IDEAL.items()},
            "balanced_1m_pct": A13_BALANCED_1M,
            "idle_removed_pct": A13_IDLE_REMOVED,
        },
    }
    if args.measured:
        override = CostModel.load(args.cost_model) if args.cost_model else None
        records = load_measured(args.measured, override, args.cost_model_pp)
        table = validate(records, args.comm_s, window=not args.no_window)
        print_validation(table, args.tolerance)
        result["validation"] = table
    if args.plot:
        curves = {
            m: bubble_vs_p(m, 1024 * K, overhead, args.fixed_chunk, args.first_chunk, args.block)
            for m in args.models
        }
        plot(curves, 1024 * K, args.overhead_ms, args.plot)
        result["bubble_vs_p_1m"] = curves
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
