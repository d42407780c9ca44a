# SPDX-License-Identifier: Apache-2.0
"""Load test of the omni image server: N requests at concurrency C.

    python -m benchmarks.serve_load --requests 200 --concurrency 16 --json out/load.json

Starts `vllm-omni serve <tiny Qwen-Image> --enforce-eager` on loopback (or uses --url), warms
it up, then sends the requests with the official openai client while a second thread polls
/health. Reports throughput, P50/P99 latency, errors, /health availability, the CPU time each of
the server's processes used during the run, and the server's memory before and after it: its own
process, and with its stage processes, as RSS (which counts the libraries every process maps
once per process) and as PSS (each shared page split among the processes that map it: what the
server tree adds to the machine's memory use).

`--compare-generation-kv` runs a second server after the first, whose text encoder has the KV
cache a generating stage would get (the CPU default of 4 GiB, the model's 8K context), and
prints the ratios: the cost of not sizing the encoder's cache for one step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import psutil
import requests

from benchmarks.common import BIN, ServerProcess, alternate, geomean, percentile, write_result
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir


def memory_mib(pid: int) -> dict[str, float]:
    """RSS and PSS of the process alone and with all its descendants, MiB."""
    proc = psutil.Process(pid)
    tree = [proc, *proc.children(recursive=True)]
    info = {p.pid: p.memory_full_info() for p in tree}
    return {
        "server_rss": info[pid].rss / 2**20,
        "with_stages_rss": sum(i.rss for i in info.values()) / 2**20,
        "server_pss": info[pid].pss / 2**20,
        "with_stages_pss": sum(i.pss for i in info.values()) / 2**20,
    }


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU time (user + system) of the server and each of its descendants, by process name."""
    out: dict[str, float] = {}
    proc = psutil.Process(pid)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times, name = p.cpu_times(), p.name()
        except psutil.NoSuchProcess:
            continue
        name = "server" if p.pid == pid else name
        out[name] = out.get(name, 0.0) + times.user + times.system
    return out


class HealthPoller(threading.Thread):
    def __init__(self, url: str, interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.url, self.interval_s = url, interval_s
        self.ok, self.failed, self.max_latency_s = 0, 0, 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            start = time.monotonic()
            try:
                good = requests.get(f"{self.url}/health", timeout=5).status_code == 200
            except requests.RequestException:
                good = False
            self.max_latency_s = max(self.max_latency_s, time.monotonic() - start)
            self.ok, self.failed = self.ok + good, self.failed + (not good)
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join()


def send(client: openai.OpenAI, i: int, args) -> tuple[float, str | None]:
    start = time.monotonic()
    try:
        result = client.images.generate(
            prompt=f"load test image {i}: a red cat on a blue sofa",
            size=args.size,
            response_format="b64_json",
            extra_body={"num_inference_steps": args.steps, "seed": i},
        )
        error = None if result.data and result.data[0].b64_json else "empty response"
    except Exception as e:  # counted, not raised: the point is to see them all
        error = f"{type(e).__name__}: {e}"
    return time.monotonic() - start, error


def run_load(client, n: int, args, offset: int = 0) -> tuple[list[float], list[str]]:
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda i: send(client, offset + i, args), range(n)))
    return [r[0] for r in results], [r[1] for r in results if r[1]]


GENERATION_KV_YAML = """
stages:
  - name: text_encoder
    engine_type: AR
    model: text_encoder
    tokenizer: tokenizer
    processor: qwen_image_prompt
    engine_args: {kv_cache_memory_bytes: 4294967296, max_model_len: 8192}
  - name: dit
    engine_type: DiT
    model: .
    executor: qwen_image
    inputs:
      prompt_embeds: text_encoder.prompt_embeds
      negative_prompt_embeds: text_encoder.negative_prompt_embeds
    scheduler: step
    final_output: true
"""


def run_one(args, url: str | None, model: str | None, extra: list[str] = ()) -> dict:
    """The load against `url`, or against a server of `model` started for it."""
    if url is not None:
        return measure_load(args, url, None)
    command = [str(BIN / "vllm-omni"), "serve", model, "--enforce-eager", *extra]
    with ServerProcess(command, timeout_s=600) as server:
        return measure_load(args, server.url, server.proc.pid)


def measure_load(args, url: str, pid: int | None) -> dict:
    client = openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=os.environ.get("OPENAI_API_KEY", "none"),
        max_retries=0,
        timeout=600,
    )
    unknown = dict.fromkeys(("server_rss", "with_stages_rss", "server_pss", "with_stages_pss"))
    run_load(client, args.warmup, args, offset=10**6)
    mem_before = memory_mib(pid) if pid else unknown
    cpu_before = cpu_seconds(pid) if pid else {}
    poller = HealthPoller(url)
    poller.start()
    start = time.monotonic()
    latencies, errors = run_load(client, args.requests, args)
    wall = time.monotonic() - start
    poller.stop()
    mem_after = memory_mib(pid) if pid else unknown
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in (cpu_seconds(pid) if pid else {}).items()}
    report = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "size": args.size,
        "steps": args.steps,
        "wall_s": wall,
        "throughput_rps": args.requests / wall,
        "latency_p50_s": statistics.median(latencies),
        "latency_p99_s": percentile(latencies, 99),
        "errors": len(errors),
        "error_samples": errors[:5],
        "health_ok": poller.ok,
        "health_failed": poller.failed,
        "health_max_latency_s": poller.max_latency_s,
        "cpu_s_during_run": cpu,  # by process name (the server's own: "server")
        "memory_mib_before": mem_before,
        "memory_mib_after": mem_after,
        "memory_growth_pct": {
            k: 100 * (mem_after[k] / mem_before[k] - 1) if pid else None for k in mem_before
        },
    }
    print(
        f"{args.requests} requests at concurrency {args.concurrency} "
        f"({args.size}, {args.steps} steps) in {wall:.1f} s: {report['throughput_rps']:.2f} req/s"
    )
    print(
        f"latency P50 {report['latency_p50_s']:.2f} s, P99 {report['latency_p99_s']:.2f} s; "
        f"errors {len(errors)}"
    )
    print(
        f"/health: {poller.ok} ok, {poller.failed} failed, "
        f"slowest {poller.max_latency_s * 1e3:.0f} ms"
    )
    b, a = mem_before, mem_after
    if pid:
        busy = ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(cpu.items()))
        print(f"CPU seconds during the run ({wall:.1f} s wall): {busy}")
        print(
            f"memory after warm-up -> after run, MiB: server RSS {b['server_rss']:.0f} -> "
            f"{a['server_rss']:.0f}; with stage processes RSS {b['with_stages_rss']:.0f} -> "
            f"{a['with_stages_rss']:.0f}, PSS {b['with_stages_pss']:.0f} -> "
            f"{a['with_stages_pss']:.0f} ({report['memory_growth_pct']['with_stages_pss']:+.1f}%)",
            flush=True,
        )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="an omni server already running (default: start one)")
    parser.add_argument("--model", help="model folder (default: the tiny Qwen-Image pipeline)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--compare-generation-kv",
        action="store_true",
        help="also run a server whose text encoder has a generation-sized KV cache",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    model = None
    if not args.url:
        model = args.model or str(
            build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"]
        )
    if not (args.compare_generation_kv and model is not None):
        report = run_one(args, args.url, model)
    else:
        # Both orders (one-step first, then generation first): the server started second ran
        # faster here in either role, so one order alone biases the ratio.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as graph:
            graph.write(GENERATION_KV_YAML)
            graph.flush()

            def arm(name: str, extra: list[str]):
                def run() -> dict:
                    print(f"\n[{name}]")
                    return run_one(args, None, model, extra)

                return run

            arms = {
                "one_step_kv": arm("one_step_kv", []),
                "generation_kv": arm("generation_kv", ["--stage-configs", graph.name]),
            }
            runs = alternate(arms, 2)
        measures = {
            "throughput_rps": lambda r: r["throughput_rps"],
            "with_stages_pss": lambda r: r["memory_mib_after"]["with_stages_pss"],
        }
        pairs = list(zip(runs["one_step_kv"], runs["generation_kv"]))
        ratios = {
            key: geomean([get(a) / get(b) for a, b in pairs]) for key, get in measures.items()
        }
        report = {**runs, "ratios_one_step_over_generation": ratios}
        print(
            f"\none-step KV / generation KV (geometric mean of both orders): throughput "
            f"{ratios['throughput_rps']:.2f}x, memory with stage processes (PSS) "
            f"{ratios['with_stages_pss']:.2f}x"
        )
    write_result(args.json, report, dtype="auto")


if __name__ == "__main__":
    main()
