# SPDX-License-Identifier: Apache-2.0
"""Deadline-aware vs fcfs DiT scheduling on a virtual clock: the stage's own scheduler, step
costs measured on this machine, no noise.

    python -m benchmarks.dit_sched_sim --json out/dit_sched_sim.json

`dit_sched.py` replays a trace against the omni server, where two runs of one policy can differ
by more than the two policies do (two cores shared by the API server, the text encoder and the
DiT). Here the DiT stage of the tiny Qwen-Image is first timed in-process (with the DiT stage's
malloc settings): a denoising step of 1, 2, 4 and 8 requests of each image size, and the VAE
decode that ends them, each fitted as a fixed cost plus a cost per request. Then the traces of
`dit_sched.make_trace` are replayed on a virtual clock through `DiffusionScheduler` with each
policy, every engine step lasting what its transformer calls and decodes cost by those fits,
times `--contention` (on the server the DiT shares the two cores with the API server and the
text encoder). Requests reach the DiT stage `--pre-ms` after they arrive (text encoder, HTTP).
Per rate: the median over `--seeds` traces of SLO attainment and of each class's P99 latency,
the slowest request, and the deadline/fcfs ratios as geometric means over the seeds. Left out:
CPU contention that varies in time, the text encoder's queue, a step's cost depending on what
ran before it (cache effects). The in-process timings themselves moved by up to 2x between two
runs, so compare policies within one run, not runs with each other.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.common import percentile, write_result
from benchmarks.dit_sched import make_trace, paired_ratios
from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import (
    DiffusionScheduler,
    DiTRunnerOutput,
    DiTSchedulerConfig,
)
from vllm_omni.platform.cpu_defaults import MALLOC_DEFAULTS
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

SIZES = (64, 192)
ROWS = (1, 2, 4, 8)
PASSES = 3  # the median of three timings of each point


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fixed + per-row seconds, both kept >= 0."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / var) if var else 0.0
    return max(0.0, my - slope * mx), slope


def calibrate(model: str, steps: int = 10) -> dict[int, dict[str, tuple[float, float]]]:
    """Seconds of one denoising step and of the decode, per size, as (fixed, per request)."""
    from vllm_omni.diffusion.config import DiTConfig
    from vllm_omni.diffusion.engine_core import DiffusionEngineCore

    core = DiffusionEngineCore(DiTConfig(model=model), "step", "qwen_image")
    dim = core.executor.runner.pipe.transformer.config.joint_attention_dim
    embeds = torch.randn(20, dim, generator=torch.Generator().manual_seed(0))
    count = 0

    def timed(size: int, rows: int) -> tuple[float, float]:
        nonlocal count
        for _ in range(rows):
            count += 1
            params = DiffusionSamplingParams(
                height=size, width=size, num_inference_steps=steps, seed=count
            )
            core.add_request(f"c{count}", {"prompt_embeds": embeds}, params)
        step_s, last_s = [], 0.0
        while core.has_unfinished_requests():
            start = time.perf_counter()
            finished, _, _ = core.step()
            if finished:
                last_s = time.perf_counter() - start
            else:
                step_s.append(time.perf_counter() - start)
        step = statistics.median(step_s[1:])
        return step, max(0.0, last_s - step)

    costs = {}
    for size in SIZES:
        timed(size, 1)  # warm-up
        passes = [{rows: timed(size, rows) for rows in ROWS} for _ in range(PASSES)]
        measured = {
            rows: tuple(statistics.median(p[rows][i] for p in passes) for i in (0, 1))
            for rows in ROWS
        }
        costs[size] = {
            "step": fit_line([(rows, m[0]) for rows, m in measured.items()]),
            "decode": fit_line([(rows, m[1]) for rows, m in measured.items()]),
        }
    return costs


def simulate(policy: str, trace, slo_ms: dict, costs: dict, args) -> dict:
    clock = SimpleNamespace(now=0.0)
    scheduler = DiffusionScheduler(
        DiTSchedulerConfig(policy=policy, max_num_seqs=args.max_num_seqs),
        DiTCacheManager(),
        lambda request: 1,
        clock=lambda: clock.now,
    )
    pre_s = args.pre_ms / 1000
    pending, jobs, latency = list(trace), {}, {}
    while len(latency) < len(trace):
        while pending and pending[0].arrival_s + pre_s <= clock.now:
            job = pending.pop(0)
            params = DiffusionSamplingParams(
                height=job.size,
                width=job.size,
                num_inference_steps=job.steps,
                deadline=job.arrival_s + slo_ms[job.kind] / 1000,
            )
            scheduler.add_request(DiTRequest(str(job.index), params, {}, arrival=clock.now))
            jobs[str(job.index)] = job
        scheduled = scheduler.schedule()
        if scheduled.is_empty:
            clock.now = pending[0].arrival_s + pre_s
            continue
        output = DiTRunnerOutput()
        for group in scheduled.groups:
            size = jobs[group[0]].size
            fixed, per_row = costs[size]["step"]
            output.step_seconds.append(args.contention * (fixed + per_row * len(group)))
            done = [
                rid
                for rid in group
                if scheduler.requests[rid].num_steps_done + 1 >= scheduler.requests[rid].num_steps
            ]
            fixed, per_row = costs[size]["decode"]
            decode_s = args.contention * (fixed + per_row * len(done)) if done else 0.0
            output.decode_seconds.append(decode_s)
            output.finished.update(dict.fromkeys(done))
        clock.now += sum(output.step_seconds) + sum(output.decode_seconds)
        for request, _ in scheduler.update_from_output(scheduled, output):
            job = jobs[request.request_id]
            latency[job.index] = clock.now - job.arrival_s
    met = [j for j in trace if latency[j.index] * 1000 <= slo_ms[j.kind]]
    out = {"slo_attainment": len(met) / len(trace), "max_latency_s": max(latency.values())}
    for kind in ("small", "large"):
        lat = [latency[j.index] for j in trace if j.kind == kind]
        out[kind] = {
            "p99_s": percentile(lat, 99),
            "slo_attainment": sum(1 for j in met if j.kind == kind) / max(1, len(lat)),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[8, 10, 12, 14, 16])
    parser.add_argument("--slo-ms", type=float, nargs=2, default=[236, 1058])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--contention", type=float, default=1.0)
    parser.add_argument("--pre-ms", type=float, default=30.0)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if any(name not in os.environ for name in MALLOC_DEFAULTS):
        # glibc reads these at start-up; the DiT stage's process runs with them (a decode
        # without them costs several times more here), so the timings must too.
        argv = [sys.executable, "-m", __spec__.name, *sys.argv[1:]]
        os.execve(sys.executable, argv, MALLOC_DEFAULTS | dict(os.environ))
    if args.seeds < 1 or args.contention <= 0 or min(args.rates) <= 0:
        parser.error("--seeds must be >= 1, --contention and --rates > 0")
    model = str(build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"])
    costs = calibrate(model)
    for size, c in costs.items():
        print(
            f"{size}x{size}: step {c['step'][0] * 1e3:.1f} + {c['step'][1] * 1e3:.2f} ms/request, "
            f"decode {c['decode'][0] * 1e3:.1f} + {c['decode'][1] * 1e3:.1f} ms/request"
        )
    slo_ms = dict(zip(("small", "large"), args.slo_ms))
    rows = []
    for rate in args.rates:
        runs = {p: [] for p in ("fcfs", "deadline")}
        for seed in range(args.seeds):
            trace = make_trace(args.requests, rate, seed)
            for policy in runs:
                runs[policy].append(simulate(policy, trace, slo_ms, costs, args))
        row = {"rate": rate, "runs": runs}
        for policy, results in runs.items():
            row[policy] = {
                "slo_attainment": statistics.median(r["slo_attainment"] for r in results),
                "small_p99_s": statistics.median(r["small"]["p99_s"] for r in results),
                "large_p99_s": statistics.median(r["large"]["p99_s"] for r in results),
                "max_latency_s": max(r["max_latency_s"] for r in results),
            }
        row["ratios"] = paired_ratios(runs)
        rows.append(row)
        f, d, ratio = row["fcfs"], row["deadline"], row["ratios"]
        print(
            f"{rate:5.1f}/s: attainment fcfs {f['slo_attainment']:.0%} deadline "
            f"{d['slo_attainment']:.0%} ({ratio['slo_attainment']:.2f}x), small P99 "
            f"{f['small_p99_s']:.2f} / {d['small_p99_s']:.2f} s ({ratio['small_p99']:.2f}x), "
            f"large P99 {f['large_p99_s']:.2f} / {d['large_p99_s']:.2f} s, slowest "
            f"{f['max_latency_s']:.1f} / {d['max_latency_s']:.1f} s"
        )
    out = {
        "args": vars(args) | {"json": str(args.json)},
        "costs_s": {str(size): c for size, c in costs.items()},
        "rows": rows,
    }
    write_result(args.json, out, dtype="auto")


if __name__ == "__main__":
    main()
