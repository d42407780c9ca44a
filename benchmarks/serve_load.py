# SPDX-License-Identifier: Apache-2.0
"""Load test of the omni image server: N requests at concurrency C.

    .venv/bin/python benchmarks/serve_load.py --requests 200 --concurrency 16 --json out/load.json

Starts `vllm-omni serve <tiny Qwen-Image> --enforce-eager` on loopback (or uses --url), warms
it up, then sends the requests with the official openai client while a second thread polls
/health. Reports throughput, P50/P99 latency, errors, /health availability and the server's
resident memory (its own process, and with its stage processes) before and after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import psutil
import requests

from vllm_omni.models.tiny import build_tiny_models, default_models_dir


def start_server(model: str) -> tuple[subprocess.Popen, str, tempfile._TemporaryFileWrapper]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile("w+", prefix="serve-load-", suffix=".log")
    binary = Path(sys.executable).parent / "vllm-omni"
    cmd = [
        str(binary),
        "serve",
        model,
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{Path(log.name).read_text()[-4000:]}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError("server did not start")


def rss_mib(pid: int) -> tuple[float, float]:
    """(the process alone, the process and all its descendants), MiB."""
    proc = psutil.Process(pid)
    own = proc.memory_info().rss
    tree = own + sum(c.memory_info().rss for c in proc.children(recursive=True))
    return own / 2**20, tree / 2**20


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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="an omni server already running (default: start one)")
    parser.add_argument("--model", help="model folder (default: the tiny Qwen-Image pipeline)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=32)
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    proc = log = None
    if args.url:
        url = args.url
        pid = None
    else:
        model = args.model or str(
            build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"]
        )
        proc, url, log = start_server(model)
        pid = proc.pid
    client = openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=os.environ.get("OPENAI_API_KEY", "none"),
        max_retries=0,
        timeout=600,
    )
    try:
        run_load(client, args.warmup, args, offset=10**6)
        rss_before = rss_mib(pid) if pid else (float("nan"),) * 2
        poller = HealthPoller(url)
        poller.start()
        start = time.monotonic()
        latencies, errors = run_load(client, args.requests, args)
        wall = time.monotonic() - start
        poller.stop()
        rss_after = rss_mib(pid) if pid else (float("nan"),) * 2
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()

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
        "rss_mib_before": {"server": rss_before[0], "with_stages": rss_before[1]},
        "rss_mib_after": {"server": rss_after[0], "with_stages": rss_after[1]},
        "rss_growth_pct": {
            "server": 100 * (rss_after[0] / rss_before[0] - 1),
            "with_stages": 100 * (rss_after[1] / rss_before[1] - 1),
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
    growth = report["rss_growth_pct"]
    print(
        f"RSS after warm-up -> after run: server {rss_before[0]:.0f} -> {rss_after[0]:.0f} MiB "
        f"({growth['server']:+.1f}%), with stage processes "
        f"{rss_before[1]:.0f} -> {rss_after[1]:.0f} MiB ({growth['with_stages']:+.1f}%)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
