# SPDX-License-Identifier: Apache-2.0
"""Any diffusers text-to-image or text-to-video pipeline step-batched by the call loop vs the
pipeline called per request, side by side in one run (in-process, no engine).

    python -m benchmarks.diffusers_calls --json out/diffusers_calls.json
    python -m benchmarks.diffusers_calls --model cogvideox --frames 9

A tiny model of the tests (`--model`, vllm_omni.testing.tiny) at `--height`x`--width` with
`--steps` steps; a pipeline whose `__call__` takes `num_frames` makes videos of `--frames`
frames (ImagePipelineCalls or VideoPipelineCalls, as the DiT stage would pick). The baseline is
what a server without batching does: the pipeline called for each request in turn, with the
arguments the call loop gives it for that request (`call_kwargs`: same prompt, size, steps,
guidance and a fresh generator of the same seed). The other arm is the framework's
`CallLoopExecutor` driven as the DiT stage's scheduler would in `step` mode: every request
admitted at once, one step of all of them per `execute_model`, each finished request released.
Scenarios:
- `alone`: one request: the call loop's overhead (threads, gates, batching) on a single run;
- `concurrent N` (`--requests`): N prompts and seeds arriving together;
- `mixed N`: N requests arriving together, alternating `--steps`//2 and `--steps` steps: the
  short ones leave the batch halfway and the rest go on in a smaller one.
The arms alternate (`benchmarks.common.alternate`) over `--pairs` pairs after an untimed run of
each, which also compares their images or videos' frames (largest pixel difference, in 1/255)
and counts the rows of each denoiser forward (two a request under classifier-free guidance).
Reported per scenario: seconds of each arm (median), the ratio per pair (call loop speed /
diffusers speed: median and geometric mean), requests per second, mean latency (a request's
completion, counted from when all arrived) and the seconds inside the denoiser's forwards (the
rest is the pipeline's own code, encoders, VAE and, for the call loop, its threads and
batching).

On a machine shared with other work, OpenMP's default (spinning) wait policy can make the
diffusers arm, one thread that never blocks, several times slower than the same work in the
call loop, whose threads block at each hand-over (seen on 2 cores beside a test run, even with
one request); `OMP_WAIT_POLICY=passive` removed that there. The result records the policy.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import alternate, paired_ratio, write_result
from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.call_loop import CallLoopExecutor
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTSchedulerOutput
from vllm_omni.diffusion.video_params import VideoSamplingParams
from vllm_omni.models.diffusers_pipeline.calls import ImagePipelineCalls
from vllm_omni.models.diffusers_pipeline.signature import call_args
from vllm_omni.models.diffusers_pipeline.video_calls import VideoPipelineCalls
from vllm_omni.testing.tiny import TinyModels, default_models_dir

PROMPTS = [
    "a red cat on a sofa",
    "a lighthouse at dusk",
    "two green apples",
    "a rainy city street at night",
    "a mountain lake",
    "an old bicycle against a wall",
    "a bowl of ramen",
    "a snowy forest",
]
MAX_DIFF = 2  # in 1/255: what "the same image" allows (float summation order in a batch)
DEFAULT_FRAMES = 9  # frames of a video: the tiny CogVideoX's default (8k + 1)


@dataclass(frozen=True)
class Job:
    """One request: its prompt, seed and step count."""

    prompt: str
    seed: int
    steps: int


@dataclass
class Run:
    """One run of an arm over a scenario's jobs."""

    seconds: float
    latencies: list[float]  # each job's completion, from when all arrived
    denoiser_s: float  # inside the denoiser's forwards
    outputs: list[np.ndarray]  # uint8: each image (H, W, 3) or video (F, H, W, 3)


class DenoiserProbe:
    """Forward hooks on the denoiser: seconds inside its forwards and, when `rows` is a list,
    the rows (batch size) of each forward."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seconds = 0.0
        self.rows: list[int] | None = None
        self._start = 0.0
        module.register_forward_pre_hook(self._pre, with_kwargs=True)
        module.register_forward_hook(self._post)

    def _pre(self, module, args, kwargs) -> None:
        if self.rows is not None:
            first = kwargs.get("hidden_states", args[0] if args else None)
            self.rows.append(first.shape[0] if torch.is_tensor(first) else len(first))
        self._start = time.perf_counter()

    def _post(self, module, args, output) -> None:
        self.seconds += time.perf_counter() - self._start


def run_length(values: list[int]) -> str:
    """`[8, 8, 4]` as `8x2 4x1`."""
    return " ".join(f"{v}x{len(list(g))}" for v, g in itertools.groupby(values))


def is_video(pipe: Any) -> bool:
    """Whether the pipeline makes videos: its `__call__` takes `num_frames`."""
    return "num_frames" in call_args(type(pipe))


class Arms:
    """The two ways to serve a scenario's jobs, over one loaded pipeline: both build each job's
    request the same way (`request`) and read its pixels the same way (`pixels`)."""

    def __init__(self, pipe: Any, height: int, width: int, frames: int = DEFAULT_FRAMES) -> None:
        self.pipe, self.height, self.width, self.frames = pipe, height, width, frames
        self.video = is_video(pipe)
        calls = VideoPipelineCalls(pipe) if self.video else ImagePipelineCalls(pipe)
        self.calls = calls
        self.probe = DenoiserProbe(getattr(pipe, calls.denoiser))
        self.cache = DiTCacheManager()
        self.loop = CallLoopExecutor(DiTConfig(model="in-memory"), self.cache, calls)
        self._ids = itertools.count()

    def request(self, job: Job) -> DiTRequest:
        """The job as the DiT stage would get it (guidance: the params class's default)."""
        size = {"height": self.height, "width": self.width}
        steps = {"num_inference_steps": job.steps, "seed": job.seed}
        if self.video:
            params: Any = VideoSamplingParams(num_frames=self.frames, **size, **steps)
        else:
            params = DiffusionSamplingParams(**size, **steps)
        rid = f"r{next(self._ids)}"
        return DiTRequest(rid, params, {"prompt": job.prompt})

    def pixels(self, result: Any) -> np.ndarray:
        """A request's image, or its video's frames, from what `calls.result` returned."""
        return result["video"] if self.video else result

    def diffusers(self, jobs: list[Job]) -> Run:
        """The pipeline's own call, one request after another, with the call loop's arguments."""
        requests = [self.request(job) for job in jobs]
        outputs, latencies = [], []
        in_denoiser = self.probe.seconds
        start = time.perf_counter()
        for request in requests:
            with torch.inference_mode():
                out = self.pipe(**self.calls.call_kwargs(request))  # a fresh seeded generator
            outputs.append(self.pixels(self.calls.result(request, out)))
            latencies.append(time.perf_counter() - start)
        seconds = time.perf_counter() - start
        return Run(seconds, latencies, self.probe.seconds - in_denoiser, outputs)

    def call_loop(self, jobs: list[Job]) -> Run:
        """All jobs admitted at the first step, stepped together; each leaves when done."""
        requests = {r.request_id: r for r in map(self.request, jobs)}
        for request in requests.values():
            self.loop.check_request(request)
        order = list(requests)
        new, running = list(order), list(order)
        outputs: dict[str, np.ndarray] = {}
        latencies: dict[str, float] = {}
        in_denoiser = self.probe.seconds
        start = time.perf_counter()
        while running:
            out = self.loop.execute_model(DiTSchedulerOutput("step", new, [running]), requests)
            if out.failed:
                raise RuntimeError(f"call loop: requests failed: {out.failed}")
            now = time.perf_counter() - start
            for rid, result in out.finished.items():
                outputs[rid], latencies[rid] = self.pixels(result), now
                self.cache.release(rid)  # as the scheduler does for a finished request
            running = [rid for rid in running if rid not in out.finished]
            new = []
        seconds = time.perf_counter() - start
        return Run(
            seconds,
            [latencies[rid] for rid in order],
            self.probe.seconds - in_denoiser,
            [outputs[rid] for rid in order],
        )


def max_pixel_diff(a: list[np.ndarray], b: list[np.ndarray]) -> int:
    """The largest difference of one pixel (in 1/255) between paired images or videos."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ValueError(
            f"outputs differ in shape: {[x.shape for x in a]} vs {[y.shape for y in b]}"
        )
    return max(int(np.abs(x.astype(int) - y.astype(int)).max()) for x, y in zip(a, b))


def bench(arms: Arms, jobs: list[Job], pairs: int) -> dict[str, Any]:
    """An untimed run of each arm (warm-up, outputs compared, rows counted), then the pairs."""
    base = arms.diffusers(jobs)
    arms.probe.rows = []
    ours = arms.call_loop(jobs)
    rows, arms.probe.rows = arms.probe.rows, None
    runs = alternate(
        {"diffusers": lambda: arms.diffusers(jobs), "call_loop": lambda: arms.call_loop(jobs)},
        pairs,
    )
    seconds = {arm: [r.seconds for r in rs] for arm, rs in runs.items()}
    out: dict[str, Any] = {
        "requests": len(jobs),
        "steps": [job.steps for job in jobs],
        "seconds": seconds,
        "ratio": paired_ratio(seconds["diffusers"], seconds["call_loop"]),
        "max_pixel_diff": max_pixel_diff(base.outputs, ours.outputs),
        "call_loop_rows_per_forward": rows,
    }
    for arm, rs in runs.items():
        median_s = statistics.median(seconds[arm])
        out[arm] = {
            "seconds": median_s,
            "requests_per_s": len(jobs) / median_s,
            "mean_latency_s": statistics.median(statistics.fmean(r.latencies) for r in rs),
            "denoiser_s": statistics.median(r.denoiser_s for r in rs),
        }
    return out


def jobs_for(n: int, steps: list[int]) -> list[Job]:
    """`n` jobs, other prompts and seeds, step counts taken from `steps` in turn."""
    return [Job(PROMPTS[k % len(PROMPTS)], k, steps[k % len(steps)]) for k in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="flux-dev", help="a tiny model: sd3, flux-dev, sana...")
    parser.add_argument("--models-dir", type=Path, default=None, help="default: the tiny cache")
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--frames",
        type=int,
        default=DEFAULT_FRAMES,
        help="frames of each video: a multiple of the pipeline's frame step, plus 1 (CogVideoX: "
        "8k + 1); ignored for image pipelines",
    )
    parser.add_argument(
        "--requests", type=int, nargs="+", default=[4, 8], help="concurrent requests (each N)"
    )
    parser.add_argument("--mixed", type=int, default=8, help="requests of mixed steps (0: skip)")
    parser.add_argument("--pairs", type=int, default=3)
    threads = len(os.sched_getaffinity(0))
    parser.add_argument("--threads", type=int, default=threads, help="torch threads (all cores)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps: at least 2 (mixed runs half as many)")
    torch.set_num_threads(args.threads)

    from diffusers import DiffusionPipeline

    folder = TinyModels(args.models_dir or default_models_dir())[args.model]
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    arms = Arms(pipe, args.height, args.width, args.frames)
    if arms.video and (args.frames - 1) % arms.calls.info.frame_step:
        step = arms.calls.info.frame_step
        parser.error(f"--frames: {type(pipe).__name__} makes {step}k + 1 frames, not {args.frames}")

    scenarios: dict[str, list[Job]] = {"alone": jobs_for(1, [args.steps])}
    for n in args.requests:
        scenarios[f"concurrent {n}"] = jobs_for(n, [args.steps])
    if args.mixed:
        scenarios[f"mixed {args.mixed}"] = jobs_for(args.mixed, [args.steps // 2, args.steps])
    start = time.perf_counter()
    results = {name: bench(arms, jobs, args.pairs) for name, jobs in scenarios.items()}
    result = {
        "model": args.model,
        "pipeline": type(pipe).__name__,
        "denoiser": arms.loop.calls.denoiser,
        "output": "video" if arms.video else "image",
        "height": args.height,
        "width": args.width,
        "frames": args.frames if arms.video else None,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "pairs": args.pairs,
        "scenarios": results,
        "wall_s": time.perf_counter() - start,
    }
    report(result)
    write_result(args.json, result, dtype=str(pipe.dtype).removeprefix("torch."))


def report(r: dict[str, Any]) -> None:
    frames = f", {r['frames']} frames" if r["frames"] else ""
    print(
        f"\n{r['model']} ({r['pipeline']}), {r['height']}x{r['width']}{frames}, "
        f"{r['steps']} steps, "
        f"{r['threads']} threads (OMP_WAIT_POLICY={r['omp_wait_policy']}); medians of "
        f"{r['pairs']} pairs; ratio = call loop speed / diffusers speed (per pair: median, "
        "geometric mean)"
    )
    head = ("scenario", "diffusers s", "loop s", "ratio", "geomean", "req/s d", "req/s loop")
    head += ("latency d", "latency loop", "denoiser d", "denoiser loop", "max diff")
    line = "{:<14}{:>12}{:>8}{:>7}{:>9}{:>9}{:>11}{:>11}{:>14}{:>12}{:>15}{:>10}"
    print(line.format(*head))
    for name, s in r["scenarios"].items():
        d, c = s["diffusers"], s["call_loop"]
        print(
            line.format(
                name,
                f"{d['seconds']:.3f}",
                f"{c['seconds']:.3f}",
                f"{s['ratio']['median']:.2f}",
                f"{s['ratio']['geomean']:.2f}",
                f"{d['requests_per_s']:.1f}",
                f"{c['requests_per_s']:.1f}",
                f"{d['mean_latency_s']:.3f}",
                f"{c['mean_latency_s']:.3f}",
                f"{d['denoiser_s']:.3f}",
                f"{c['denoiser_s']:.3f}",
                f"{s['max_pixel_diff']}/255" + ("" if s["max_pixel_diff"] <= MAX_DIFF else " !"),
            )
        )
    alone = r["scenarios"]["alone"]
    extra = alone["call_loop"]["seconds"] - alone["diffusers"]["seconds"]
    print(f"alone: the call loop's overhead {1000 * extra / r['steps']:+.1f} ms per step")
    for name, s in r["scenarios"].items():
        rows = run_length(s["call_loop_rows_per_forward"])
        print(f"{name}: rows x forwards of the denoiser in the call loop: {rows}")
    worst = max(s["max_pixel_diff"] for s in r["scenarios"].values())
    kind = "videos" if r["output"] == "video" else "images"
    verdict = f"same {kind}" if worst <= MAX_DIFF else f"DIFFERENT {kind} (> {MAX_DIFF}/255)"
    print(f"max pixel difference, call loop vs diffusers: {worst}/255 ({verdict})")
    print(f"wall time of the benchmark: {r['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
