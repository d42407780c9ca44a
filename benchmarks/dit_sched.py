# SPDX-License-Identifier: Apache-2.0
"""Deadline-aware DiT scheduling vs first-come-first-served on the omni image server.

    python -m benchmarks.dit_sched --json out/dit_sched.json

A seeded mixed trace is replayed, open loop (each request sent at its arrival time, whatever
the server is doing), against `vllm-omni serve <tiny Qwen-Image>` started once per policy:
`--dit-scheduling-policy fcfs` (the default: admission in arrival order, every running
request advances each step) and `--dit-scheduling-policy deadline` (least slack first; other
image sizes ride along as far as the requests still on time can spare). Both servers get the same
trace; `--repeats` alternates them (AB BA ...).

Trace (`--requests`, Poisson arrivals): 75% small images (64x64, 4-8 steps) and 25% large ones
(192x192, 20-30 steps). Each request's latency SLO is `--slo-x` times its class's unloaded latency
(measured on the first server before the trace, one request at a time; every run uses the same
SLOs; `--slo-ms` fixes them instead), sent as `latency_slo_ms`. The arrival rate is `--load`
times what the server finishes one request at a time (1 / the mean unloaded latency of the
mix), so that the load is the same on a machine twice as fast (this VM's speed varies that
much from day to day); `--rate` fixes it instead. `--per-run` scales both to every server's own
unloaded latencies (it can drift twofold within minutes). Reported per policy: SLO attainment
(finished within the SLO), goodput (such requests per second of trace), P50/P99 latency of
each class, the largest latency (starvation: every request must finish), errors, and the
mean time per request at each stage (the server's `vllm_omni:stage_request_seconds`); with
`--repeats`, the median of each over the runs, and the ratios as geometric means over the
pairs (the policies alternate: AB BA AB ...). `--admission-control` starts the deadline
server with `--dit-admission-control`: a refused request (HTTP 429) counts as a missed SLO and
in no latency percentile.

`--floor` adds a third server per repeat, in the alternation: fcfs on the same trace with its
large requests left out (the small ones at the same arrival times). No order of the DiT queue
can give small requests less than having no large image on the machine at all, so its small P99
bounds what any policy that serves every request can reach (admission control, which refuses
some, can go below it); printed as floor / fcfs (the best ratio such a policy could show) and
deadline / floor (how far the policy is from it).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import requests
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import BIN, ServerProcess, alternate, geomean, percentile, write_result
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

POLICIES = ("fcfs", "deadline")


@dataclass(frozen=True)
class Job:
    index: int
    arrival_s: float
    kind: str  # "small" or "large"
    size: int
    steps: int


SMALL_SHARE = 0.75


def make_trace(n: int, rate: float, seed: int) -> list[Job]:
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        if rng.random() < SMALL_SHARE:
            jobs.append(Job(i, t, "small", 64, rng.randint(4, 8)))
        else:
            jobs.append(Job(i, t, "large", 192, rng.randint(20, 30)))
    return jobs


def one_image(client: openai.OpenAI, job: Job, slo_ms: float | None) -> None:
    extra: dict[str, Any] = {"seed": job.index, "num_inference_steps": job.steps}
    if slo_ms is not None:
        extra["latency_slo_ms"] = slo_ms
    client.images.generate(
        prompt=f"picture {job.index}", size=f"{job.size}x{job.size}", extra_body=extra
    )


def unloaded_ms(client: openai.OpenAI, job: Job, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        one_image(client, job, None)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def replay(client: openai.OpenAI, trace: list[Job], slo_ms: dict[str, float]) -> dict:
    """Send each job at its arrival time (a thread per request); latencies in seconds."""
    results: dict[int, tuple[float, str | None]] = {}

    def send(job: Job, start: float) -> None:
        sent = time.perf_counter()
        try:
            one_image(client, job, slo_ms[job.kind])
            results[job.index] = (time.perf_counter() - sent, None)
        except openai.APIError as e:
            results[job.index] = (time.perf_counter() - sent, type(e).__name__)

    threads, start = [], time.perf_counter()
    for job in trace:
        time.sleep(max(0.0, start + job.arrival_s - time.perf_counter()))
        thread = threading.Thread(target=send, args=(job, start))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    span = time.perf_counter() - start
    return summarize(trace, results, slo_ms, span)


REFUSED = "RateLimitError"  # HTTP 429: admission control refused the request


def summarize(trace, results, slo_ms, span) -> dict:
    """A refused request counts as a missed SLO, and its latency in no percentile (it
    took no work)."""
    met = [j for j in trace if results[j.index][1] is None and
           results[j.index][0] * 1000 <= slo_ms[j.kind]]  # fmt: skip
    served = [j for j in trace if results[j.index][1] != REFUSED]
    out: dict[str, Any] = {
        "requests": len(trace),
        "errors": sum(1 for r in results.values() if r[1] not in (None, REFUSED)),
        "refused": len(trace) - len(served),
        "slo_attainment": len(met) / len(trace),
        "goodput_rps": len(met) / span,
        "span_s": span,
        "max_latency_s": max((results[j.index][0] for j in served), default=0.0),
    }
    for kind in ("small", "large"):
        jobs = [j for j in trace if j.kind == kind]
        lat = [results[j.index][0] for j in served if j.kind == kind]
        if not jobs:  # the floor's trace has no large requests
            continue
        out[kind] = {
            "n": len(jobs),
            "refused": len(jobs) - len(lat),
            "p50_s": percentile(lat, 50) if lat else 0.0,
            "p99_s": percentile(lat, 99) if lat else 0.0,
            "slo_attainment": sum(1 for j in met if j.kind == kind) / len(jobs),
        }
    return out


def stage_seconds(url: str) -> dict[tuple[str, str], list[float]]:
    """(stage, phase) -> [seconds, requests] so far, from the server's
    `vllm_omni:stage_request_seconds` histogram."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    out: dict[tuple[str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "vllm_omni:stage_request_seconds":
            continue
        for sample in family.samples:
            key = (sample.labels["stage"], sample.labels["phase"])
            if sample.name.endswith("_sum"):
                out.setdefault(key, [0.0, 0.0])[0] = sample.value
            elif sample.name.endswith("_count"):
                out.setdefault(key, [0.0, 0.0])[1] = sample.value
    return out


def stage_means(before: dict, after: dict) -> dict[str, float]:
    """Mean seconds per request at each stage and phase between two scrapes ("dit running":
    the DiT stage's queue and steps), over every request of the trace."""
    means = {}
    for key, (seconds, count) in after.items():
        seconds0, count0 = before.get(key, (0.0, 0.0))
        if count > count0:
            means[" ".join(key)] = (seconds - seconds0) / (count - count0)
    return means


def run_policy(
    model: str, policy: str, args: argparse.Namespace, shared: dict, small_only: bool = False
) -> dict:
    """Replay the trace on a fresh server with `policy` (`small_only`: the trace's small
    requests only, the floor). Every run measures the unloaded latencies; the first builds the
    SLOs and the trace from them into `shared`, later runs reuse both (with `--per-run`, every
    run builds its own)."""
    extra = ["--dit-scheduling-policy", policy]
    if policy == "deadline" and args.admission_control:
        extra.append("--dit-admission-control")
    command = [str(BIN / "vllm-omni"), "serve", model, "--enforce-eager", *extra]
    with ServerProcess(command, timeout_s=600) as server:
        url = server.url
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        small, large = Job(10**6, 0, "small", 64, 6), Job(10**6, 0, "large", 192, 25)
        one_image(client, small, None)  # warm-up
        one_image(client, large, None)
        # Every server gets the same warm-up, and its own unloaded latencies show how fast the
        # machine was during its run (the SLOs and the trace come from the first server's, or
        # with --per-run from its own).
        base = {"small": unloaded_ms(client, small, 5), "large": unloaded_ms(client, large)}
        if "trace" not in shared or args.per_run:
            mean_s = (SMALL_SHARE * base["small"] + (1 - SMALL_SHARE) * base["large"]) / 1000
            rate = args.rate or args.load / mean_s
            shared["slo_ms"] = {kind: args.slo_x * ms for kind, ms in base.items()}
            if args.slo_ms:  # fixed, to compare runs across invocations (and machines' days)
                shared["slo_ms"] = dict(zip(("small", "large"), args.slo_ms))
            shared["slo_ms"]["unloaded"] = base
            shared["rate"] = rate
            shared["trace"] = make_trace(args.requests, rate, args.seed)
            print(f"unloaded small/large {base['small']:.0f}/{base['large']:.0f} ms: {rate:.2f}/s")
        trace = shared["trace"]
        if small_only:
            trace = [job for job in trace if job.kind == "small"]
        before = stage_seconds(url)
        result = replay(client, trace, shared["slo_ms"])
        result["stage_mean_s"] = stage_means(before, stage_seconds(url))
        result["unloaded_ms"] = base
        result["slo_ms"] = dict(shared["slo_ms"])
        result["rate"] = shared["rate"]
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument(
        "--load", type=float, default=1.0, help="arrival rate / one-at-a-time service rate"
    )
    parser.add_argument("--rate", type=float, help="arrivals per second (instead of --load)")
    parser.add_argument("--slo-x", type=float, default=3.0, help="SLO = x * unloaded latency")
    parser.add_argument(
        "--slo-ms", type=float, nargs=2, metavar=("SMALL", "LARGE"), help="fixed SLOs instead"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--per-run",
        action="store_true",
        help="every run scales the SLOs (--slo-x) and the arrival rate (--load) to its own "
        "server's unloaded latencies: the same trace at the same relative load and SLOs, on a "
        "machine whose speed drifts between runs",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per policy, alternating")
    parser.add_argument(
        "--admission-control",
        action="store_true",
        help="the deadline server refuses (HTTP 429) requests it cannot finish in time; they "
        "count as missed, and in no latency percentile",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run fcfs on the trace without its large requests: the small P99 no policy "
        "can beat",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.repeats < 1 or args.load <= 0 or (args.rate is not None and args.rate <= 0):
        parser.error("--repeats must be >= 1, --load and --rate > 0")
    if args.per_run and (args.rate or args.slo_ms):
        parser.error("--per-run scales rate and SLOs itself: drop --rate and --slo-ms")
    model = str(build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"])
    variants = POLICIES + (("floor",) if args.floor else ())
    shared: dict = {}

    def arm(variant: str):
        def run() -> dict:
            small_only = variant == "floor"
            policy = "fcfs" if small_only else variant
            result = run_policy(model, policy, args, shared, small_only)
            report(variant, result)
            return result

        return run

    runs = alternate({v: arm(v) for v in variants}, args.repeats)
    medians = {v: _medians(r) for v, r in runs.items()}
    for variant in variants:
        report(f"{variant} (median)", medians[variant])
    ratios = paired_ratios(runs)
    print(
        f"\ndeadline / fcfs: SLO attainment {ratios['slo_attainment']:.2f}x, "
        f"small P99 {ratios['small_p99']:.2f}x, large P99 {ratios['large_p99']:.2f}x"
    )
    if args.floor:
        print(
            f"small P99: floor / fcfs {ratios['floor_small_p99']:.2f}x (the best a policy "
            f"serving all could show), "
            f"deadline / floor {ratios['deadline_over_floor_small_p99']:.2f}x"
        )
    out = {
        "args": vars(args) | {"json": str(args.json)},
        "rate": shared["rate"],
        "runs": runs,
        "medians": medians,
        "ratios": ratios,
    }
    write_result(args.json, out, dtype="auto")


def _medians(results: list[dict]) -> dict:
    """Each figure's median over the runs (same shape as one run's result)."""

    def median(path: tuple[str, ...]) -> float:
        values = []
        for r in results:
            for key in path:
                r = r[key]
            values.append(r)
        return statistics.median(values)

    out: dict[str, Any] = {"slo_ms": results[0]["slo_ms"]}
    for key in ("slo_attainment", "goodput_rps", "max_latency_s", "errors", "refused"):
        out[key] = median((key,))
    for kind in ("small", "large"):
        if kind not in results[0]:
            continue
        out[kind] = {k: median((kind, k)) for k in ("p50_s", "p99_s", "slo_attainment", "refused")}
    return out


def _paired_ratio(runs: dict, metric, num: str = "deadline", den: str = "fcfs") -> float:
    """`num` over `den`, geometric mean over the pairs of runs (run i of each)."""
    values = [metric(n) / max(1e-9, metric(d)) for n, d in zip(runs[num], runs[den])]
    return geomean(values) if all(v > 0 for v in values) else 0.0


def paired_ratios(runs: dict) -> dict[str, float]:
    """deadline over fcfs of SLO attainment and each class's P99 latency; with a floor, its
    small P99 over fcfs's and deadline's over it."""
    small_p99 = lambda r: r["small"]["p99_s"]  # noqa: E731
    ratios = {
        "slo_attainment": _paired_ratio(runs, lambda r: r["slo_attainment"]),
        "small_p99": _paired_ratio(runs, small_p99),
        "large_p99": _paired_ratio(runs, lambda r: r["large"]["p99_s"]),
    }
    if runs.get("floor"):
        ratios["floor_small_p99"] = _paired_ratio(runs, small_p99, "floor", "fcfs")
        ratios["deadline_over_floor_small_p99"] = _paired_ratio(
            runs, small_p99, "deadline", "floor"
        )
    return ratios


def report(policy: str, r: dict) -> None:
    large = r.get("large")  # none in the floor's runs
    print(
        f"{policy:>17}: SLO attainment {r['slo_attainment']:.0%} "
        f"(small {r['small']['slo_attainment']:.0%}"
        + (f", large {large['slo_attainment']:.0%}" if large else "")
        + f"), goodput {r['goodput_rps']:.2f} req/s, small P50/P99 {r['small']['p50_s']:.2f}/"
        f"{r['small']['p99_s']:.2f} s"
        + (f", large P50/P99 {large['p50_s']:.2f}/{large['p99_s']:.2f} s" if large else "")
        + f", max {r['max_latency_s']:.1f} s, errors {r['errors']:.0f}"
        + (f", refused {r['refused']:.0f}" if r.get("refused") else "")
        + ", "
        f"SLO ms {r['slo_ms']['small']:.0f}/{r['slo_ms']['large']:.0f}"
        + (
            f", unloaded {r['unloaded_ms']['small']:.0f}/{r['unloaded_ms']['large']:.0f} ms"
            if "unloaded_ms" in r
            else ""
        )
        + (
            ", mean per stage "
            + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r["stage_mean_s"].items())
            if r.get("stage_mean_s")
            else ""
        )
    )


if __name__ == "__main__":
    main()
