# SPDX-License-Identifier: Apache-2.0
"""Mixed long and short traffic against a live PP=2 server: plain vLLM (fcfs, priority), CPP,
and CPP with SLO-aware scheduling.

    python -m benchmarks.slo_mixed --json out/slo.json

For each server configuration: start `vllm-omni serve <tiny llama> -pp 2 ...`, measure unloaded
TTFT/TPOT of short prompts and the solo TTFT of each long prompt, then replay one seeded trace
per load level - long prompts at fixed times, short prompts (256-1K tokens, 16-64 output tokens)
arriving as a Poisson process - through /v1/completions with streaming. SLOs per request, in two
regimes: "3x" - short TTFT <= 3x its unloaded TTFT; "interactive" - short TTFT <= 1 s, or 5x its
unloaded TTFT where that is longer. In both, every token gap <= 3x the unloaded TPOT and long
TTFT <= 1.3x solo. They are sent as `vllm_xargs` (ttft_slo_ms, tpot_slo_ms), which only the
SLO-aware scheduler reads: it replays the trace once per regime, while the other configurations
replay it once and are scored against both. Plain priority gets short=0, long=1. Reported per
configuration, load and regime: short-request TTFT attainment, decode-step TPOT attainment, long
TTFT / solo, goodput (requests meeting all their SLOs per second), P50/P99 TTFT per class, P99
TPOT, throughput. The JSON file holds {regime: {configuration: {load: figures}}}.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import requests

from benchmarks.common import BIN, ServerProcess, alternate, write_result
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

CONFIGS = {
    "vLLM fcfs": [],
    "vLLM priority": ["--scheduling-policy", "priority"],
    "CPP": ["--cpp"],
    "CPP+SLO": ["--cpp", "--cpp-slo"],
}
LOADS = {"low": 0.5, "high": 1.0}  # short requests per second
REGIMES = ("3x", "interactive")
SHORT_SIZES = (256, 512, 768, 1024)
VOCAB = 2048


@dataclass
class Sample:
    kind: str  # "short" | "long"
    prompt_len: int
    max_tokens: int
    at: float  # seconds after the trace starts
    ttft_s: float = float("nan")
    gaps_s: list[float] = field(default_factory=list)
    slo_ttft_s: float = float("nan")
    slo_tpot_s: float = float("nan")
    error: str | None = None

    @property
    def ttft_ok(self) -> bool:
        return self.error is None and self.ttft_s <= self.slo_ttft_s

    @property
    def good(self) -> bool:
        tpot_ok = self.kind == "long" or all(g <= self.slo_tpot_s for g in self.gaps_s)
        return self.ttft_ok and tpot_ok


def trace(seed: int, rate: float, duration: float, longs: list[int]) -> list[Sample]:
    rng = random.Random(seed)
    samples = [
        Sample("long", n, 1, at=2.0 + i * duration / len(longs)) for i, n in enumerate(longs)
    ]
    t = rng.expovariate(rate)
    while t < duration:
        samples.append(Sample("short", rng.randint(256, 1024), rng.randint(16, 64), at=t))
        t += rng.expovariate(rate)
    return sorted(samples, key=lambda s: s.at)


def token_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB) for _ in range(n)]


class Server(ServerProcess):
    """A CPP server of one configuration (`extra`: its flags) for the token-id trace."""

    def __init__(self, model: str, extra: list[str], dtype: str) -> None:
        command = [str(BIN / "vllm-omni"), "serve", model, "-pp", "2", "--max-model-len", "40000",
                   "--no-enable-prefix-caching", "--served-model-name", "m", "--dtype", dtype,
                   *extra]  # fmt: skip
        super().__init__(command, timeout_s=600)

    def complete(self, sample: Sample, prompt: list[int], priority: int, xargs: dict) -> None:
        body = {
            "model": "m",
            "prompt": prompt,
            "max_tokens": sample.max_tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0.0,
            "priority": priority,
        }
        if xargs:
            body["vllm_xargs"] = xargs
        start = time.monotonic()
        last = None
        try:
            with requests.post(
                f"{self.url}/v1/completions", json=body, stream=True, timeout=600
            ) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    now = time.monotonic()
                    if last is None:
                        sample.ttft_s = now - start
                    else:
                        sample.gaps_s.append(now - last)
                    last = now
        except Exception as e:  # recorded, the run goes on
            sample.error = f"{type(e).__name__}: {e}"


def unloaded(server: Server, rng, longs: list[int]) -> tuple[dict[int, float], float, dict]:
    ttft, gaps = {}, []
    for n in SHORT_SIZES:
        runs = []
        for _ in range(3):
            s = Sample("short", n, 32, 0)
            server.complete(s, token_ids(rng, n), 0, {})
            runs.append(s.ttft_s)
            gaps += s.gaps_s
        ttft[n] = statistics.median(runs)
    solo = {}
    for n in sorted(set(longs)):
        s = Sample("long", n, 1, 0)
        server.complete(s, token_ids(rng, n), 0, {})
        solo[n] = s.ttft_s
    return ttft, statistics.median(gaps), solo


def interpolate(table: dict[int, float], n: int) -> float:
    keys = sorted(table)
    for a, b in zip(keys, keys[1:]):
        if a <= n <= b:
            return table[a] + (table[b] - table[a]) * (n - a) / (b - a)
    return table[keys[0]] if n < keys[0] else table[keys[-1]]


def replay(server: Server, samples: list[Sample], seed: int, use_priority: bool) -> float:
    rng = random.Random(seed)
    prompts = [token_ids(rng, s.prompt_len) for s in samples]
    threads = []
    start = time.monotonic()
    for sample, prompt in zip(samples, prompts):
        time.sleep(max(0.0, start + sample.at - time.monotonic()))
        # vLLM refuses a non-zero priority unless the server schedules by priority.
        priority = int(sample.kind == "long") if use_priority else 0
        xargs = {"ttft_slo_ms": sample.slo_ttft_s * 1000}
        if sample.kind == "short":
            xargs["tpot_slo_ms"] = sample.slo_tpot_s * 1000
        t = threading.Thread(target=server.complete, args=(sample, prompt, priority, xargs))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return time.monotonic() - start


def engine_slo_counts(server: Server) -> dict[str, float]:
    """SLO outcomes the server's scheduler counted (vllm_omni:slo_* on /metrics; CPP+SLO only)."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    counts = {}
    for kind in ("ttft", "tpot"):
        for outcome in ("met", "missed"):
            m = re.search(rf'^vllm_omni:slo_{kind}_total{{outcome="{outcome}"}} (\S+)$', text, re.M)
            counts[f"{kind}_{outcome}"] = float(m.group(1)) if m else float("nan")
    return counts


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def summarize(samples: list[Sample], wall: float, solo: dict[int, float]) -> dict:
    short = [s for s in samples if s.kind == "short"]
    long = [s for s in samples if s.kind == "long"]
    gaps = [g for s in short for g in s.gaps_s]
    gaps_ok = [g <= s.slo_tpot_s for s in short for g in s.gaps_s]
    # The hard case: short requests that arrive while a long prompt is being prefilled.
    busy = [(s.at, s.at + s.ttft_s) for s in long if s.error is None]
    during = [s for s in short if any(a <= s.at < b for a, b in busy)]
    return {
        "short_ttft_attainment": sum(s.ttft_ok for s in short) / max(1, len(short)),
        "short_ttft_attainment_during_long": sum(s.ttft_ok for s in during) / max(1, len(during)),
        "num_short_during_long": len(during),
        "tpot_attainment": sum(gaps_ok) / max(1, len(gaps_ok)),
        "long_ttft_over_solo": [s.ttft_s / solo[s.prompt_len] for s in long],
        "goodput_rps": sum(s.good for s in samples) / wall,
        "short_ttft_p50_s": pct([s.ttft_s for s in short], 50),
        "short_ttft_p99_s": pct([s.ttft_s for s in short], 99),
        "long_ttft_s": [s.ttft_s for s in long],
        "tpot_p99_s": pct(gaps, 99),
        "throughput_rps": len(samples) / wall,
        "errors": sum(s.error is not None for s in samples),
        "num_short": len(short),
        # Per request, for a look at where the misses are (arrival, TTFT, SLO: seconds).
        "requests": [
            {
                "kind": s.kind,
                "prompt_len": s.prompt_len,
                "at": s.at,
                "ttft_s": s.ttft_s,
                "slo_ttft_s": s.slo_ttft_s,
                "max_gap_s": max(s.gaps_s, default=0.0),
            }
            for s in samples
        ],  # fmt: skip
    }


def assign_slos(
    samples: list[Sample], regime: str, ttft: dict[int, float], tpot: float, solo: dict
) -> None:
    for s in samples:
        if s.kind == "short":
            unloaded_ttft = interpolate(ttft, s.prompt_len)
            if regime == "interactive":
                s.slo_ttft_s = max(1.0, 5 * unloaded_ttft)
            else:
                s.slo_ttft_s = 3 * unloaded_ttft
            s.slo_tpot_s = 3 * tpot
        else:
            s.slo_ttft_s = 1.3 * solo[s.prompt_len]


def rescored(samples: list[Sample], regime: str, ttft, tpot, solo) -> list[Sample]:
    """The same measured requests against another regime's SLOs."""
    copies = [replace(s, gaps_s=list(s.gaps_s)) for s in samples]
    assign_slos(copies, regime, ttft, tpot, solo)
    return copies


def report(name: str, summary: dict) -> None:
    print(
        f"[{name}] short TTFT within SLO "
        f"{summary['short_ttft_attainment']:.0%} (arriving during a long prefill: "
        f"{summary['short_ttft_attainment_during_long']:.0%} of "
        f"{summary['num_short_during_long']}), TPOT {summary['tpot_attainment']:.0%}"
        f", long/solo {[round(x, 2) for x in summary['long_ttft_over_solo']]}, goodput "
        f"{summary['goodput_rps']:.2f}/s, short TTFT P50/P99 "
        f"{summary['short_ttft_p50_s']:.2f}/{summary['short_ttft_p99_s']:.2f} s, "
        f"errors {summary['errors']}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--loads", default=",".join(LOADS))
    parser.add_argument("--regimes", default=",".join(REGIMES))
    parser.add_argument("--duration", type=float, default=40.0, help="trace length, seconds")
    parser.add_argument(
        "--rate-scale", type=float, default=1.0, help="multiplies every load's short-request rate"
    )
    parser.add_argument(
        "--longs", default="16384,24576,32768,16384", help="long prompts, spread over the trace"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", default="auto", help="as vLLM's; auto is float32 on CPUs without native bf16"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="servers per configuration, run in alternation"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    longs = [int(x) for x in args.longs.split(",")]
    regimes = args.regimes.split(",")
    model = str(build_tiny_models(default_models_dir(), ["llama-8l"])["llama-8l"])
    dtype = args.dtype
    if dtype == "auto":  # what the server picks for the bf16 checkpoint (vllm_omni's CPU default)
        import torch

        from vllm_omni.platform.cpu_dtype import resolved_on_this_cpu

        dtype = str(resolved_on_this_cpu(torch.bfloat16)).removeprefix("torch.")
    print(f"dtype: {dtype}", flush=True)
    ensure_calibration(model, dtype, max(longs))

    def arm(name: str):
        def run() -> dict:
            print(f"--- {name}", flush=True)
            return run_server(name, model, dtype, longs, regimes, args)

        return run

    # Alternated: on a VM whose speed drifts, each configuration pays the drift.
    runs = alternate({name: arm(name) for name in args.configs.split(",")}, args.repeats)
    # results[regime][config][load]: the median run's figures, every run under "runs"
    results = {
        r: {name: {load: merged([run[r][load] for run in rs]) for load in rs[0][r]}
            for name, rs in runs.items()}
        for r in regimes
    }  # fmt: skip
    for regime in regimes:
        print_table(regime, results[regime], args.loads.split(","))
        if "CPP" in runs and "CPP+SLO" in runs:
            print_paired(regime, runs["CPP+SLO"], runs["CPP"], args.loads.split(","))
    write_result(args.json, results, dtype=dtype)


def run_server(name: str, model: str, dtype: str, longs, regimes, args) -> dict:
    """One server of this configuration: its unloaded latencies (its SLOs are scaled to them),
    then the trace at every load. Returns {regime: {load: figures}}."""
    results: dict[str, dict] = {r: {} for r in regimes}
    reads_slos = "--cpp-slo" in CONFIGS[name]
    with Server(model, CONFIGS[name], dtype) as server:
        ttft, tpot, solo = unloaded(server, random.Random(args.seed + 99), longs)
        print(
            f"[{name}] unloaded TTFT {ttft}, TPOT {tpot * 1e3:.1f} ms, solo long {solo}",
            flush=True,
        )
        for load in args.loads.split(","):
            measured = None
            for regime in regimes:
                if measured is not None and not reads_slos:
                    samples = rescored(measured, regime, ttft, tpot, solo)
                    counted = None
                else:
                    rate = LOADS[load] * args.rate_scale
                    samples = trace(args.seed, rate, args.duration, longs)
                    assign_slos(samples, regime, ttft, tpot, solo)
                    before = engine_slo_counts(server)
                    wall = replay(server, samples, args.seed + 1, "priority" in CONFIGS[name])
                    after = engine_slo_counts(server)
                    counted = {k: after[k] - before[k] for k in after}
                    measured = samples
                summary = summarize(samples, wall, solo)
                results[regime][load] = summary
                summary["dtype"] = dtype
                summary["unloaded_ttft_s"] = {str(n): t for n, t in ttft.items()}
                summary["solo_long_ttft_s"] = {str(n): t for n, t in solo.items()}
                summary["client_ttft_met"] = sum(s.ttft_ok for s in samples)
                summary["client_tpot_met"] = sum(
                    g <= s.slo_tpot_s for s in samples for g in s.gaps_s
                )
                report(f"{name}/{load}/{regime}", summary)
                if reads_slos and counted is not None:  # the scheduler's own count
                    summary["engine_counted"] = e = counted
                    print(
                        f"[{name}/{load}/{regime}] engine-side counts (/metrics): TTFT met "
                        f"{e['ttft_met']:.0f} missed {e['ttft_missed']:.0f} (client: met "
                        f"{summary['client_ttft_met']} of {len(samples)}), TPOT steps met "
                        f"{e['tpot_met']:.0f} missed {e['tpot_missed']:.0f} (client: met "
                        f"{summary['client_tpot_met']})",
                        flush=True,
                    )
    return results


SCALARS = (
    "short_ttft_attainment", "short_ttft_attainment_during_long", "tpot_attainment",
    "goodput_rps", "short_ttft_p50_s", "short_ttft_p99_s", "tpot_p99_s", "throughput_rps",
)  # fmt: skip
"""Figures reported as the median over repeats; the rest come from the run of median goodput."""


def merged(runs: list[dict]) -> dict:
    """Several runs of one configuration and load as one: the median of each figure (and of
    each long prompt's ratio to solo), the run itself for everything else, and all the runs."""
    if len(runs) == 1:
        return runs[0]
    middle = sorted(runs, key=lambda r: r["goodput_rps"])[len(runs) // 2]
    out = {k: v for k, v in middle.items() if k != "requests"}
    for key in SCALARS:
        out[key] = statistics.median(r[key] for r in runs)
    out["long_ttft_over_solo"] = [
        statistics.median(ratios) for ratios in zip(*(r["long_ttft_over_solo"] for r in runs))
    ]
    out["runs"] = runs
    return out


PAIRED = (
    ("short_ttft_attainment", "short TTFT ok"), ("goodput_rps", "goodput"),
    ("short_ttft_p99_s", "short P99"), ("tpot_attainment", "TPOT ok"),
)  # fmt: skip


def print_paired(regime: str, slo_runs: list[dict], cpp_runs: list[dict], loads) -> None:
    """CPP+SLO over plain CPP, repeat by repeat (servers of one repeat ran back to back),
    with the median ratio: the comparison this noisy machine allows."""
    print(f"\nCPP+SLO / CPP, {regime} regime, per repeat (median):")
    for load in loads:
        parts = []
        for key, label in PAIRED:
            ratios = [
                a[regime][load][key] / b[regime][load][key] if b[regime][load][key] else math.nan
                for a, b in zip(slo_runs, cpp_runs)
            ]
            each = " ".join(f"{x:.2f}" for x in ratios)
            parts.append(f"{label} {each} ({statistics.median(ratios):.2f}x)")
        print(f"  {load:5s} " + "; ".join(parts))


def ensure_calibration(model: str, dtype: str, max_context: int) -> None:
    """CPP+SLO judges SLOs in seconds, which needs a cost model calibrated on this machine (the
    analytic one counts FLOPs): calibrate once if there is none for this model, PP=2 and dtype."""
    from vllm_omni.cpp.cost_model_source import calibration_path

    path = calibration_path(model, 2, f"torch.{dtype}", "cpu")
    if path.is_file():
        print(f"CPP cost model: {path}", flush=True)
        return
    print("no CPP calibration for this model and dtype yet: calibrating (cached)", flush=True)
    subprocess.run(
        [sys.executable, "-m", "vllm_omni.cpp.calibrate", model, "-pp", "2", "--dtype", dtype,
         "--max-context", str(max_context)],
        check=True,
    )  # fmt: skip


def print_table(regime: str, results: dict[str, dict], loads: list[str]) -> None:
    print(
        f"\nSLO regime: {regime}\n"
        "config          load  short-TTFT-ok  (during long)  TPOT-ok  long/solo"
        "                  goodput  short-P99  vs best plain (goodput, P99)"
    )
    for load in loads:
        plain = [results[c][load] for c in ("vLLM fcfs", "vLLM priority") if c in results]
        best = max((p["goodput_rps"] for p in plain), default=float("nan"))
        best_p99 = min((p["short_ttft_p99_s"] for p in plain), default=float("nan"))
        for name in results:
            s = results[name][load]
            ratio = s["goodput_rps"] / best if best else float("nan")
            long_ratio = str([round(x, 2) for x in s["long_ttft_over_solo"]])
            print(
                f"{name:15s} {load:5s} {s['short_ttft_attainment']:12.0%} "
                f"{s['short_ttft_attainment_during_long']:14.0%} "
                f"{s['tpot_attainment']:8.0%}  {long_ratio:25s}"
                f" {s['goodput_rps']:7.2f}  {s['short_ttft_p99_s']:8.2f}s  {ratio:6.2f}x, "
                f"{s['short_ttft_p99_s'] / best_p99:.2f}x"
            )


if __name__ == "__main__":
    main()
