# SPDX-License-Identifier: Apache-2.0
"""Video job throughput: diffusers' WanPipeline called once per request vs the omni server's
/v1/videos jobs, `--jobs` in flight together.

    python -m benchmarks.video_jobs --json docs/results/video_jobs.json

The tiny Wan2.1 text-to-video pipeline of the tests (a local folder) makes `--jobs` videos of
`--frames` frames at `--size` with `--steps` steps and guidance 5 (the pipeline's default: two
transformer rows a step), prompts and seeds differing. Both arms end at the same bytes a user
wants, an MP4 per request:
- the baseline is what a diffusers user writes: `pipe(prompt, ...)` for each request in turn,
  in this process, then the frames to MP4 (`vllm_omni.video_file.encode_mp4`);
- the omni arm is `vllm serve <folder> --omni`: the jobs are created at once (POST /v1/videos),
  polled until completed and their MP4s downloaded. Its DiT stage runs the jobs' steps together,
  encodes their prompts in one call without the padding, and decodes them in one VAE call with
  the VAE's RMS norms as sums of squares (vllm_omni/models/wan/vae_norm.py: torch's CPU vector
  norm is ~20x slower);
- a third arm, the baseline with that VAE change alone (`diffusers_fast_norms`), tells apart
  what the norm gives and what serving the jobs together gives.
The arms alternate (`benchmarks.common.alternate`) over `--pairs` rounds after a warm-up of
each; reported: jobs per second of each, the ratios per round (median and geometric mean), and
how far the served videos are from the baseline's frames through the same encoder.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import requests
import torch

from benchmarks.common import alternate, paired_ratio, write_result
from benchmarks.common.server import BIN, ServerProcess
from vllm_omni.models.wan.vae_norm import use_fast_norms
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir
from vllm_omni.video_file import decode_mp4, encode_mp4

PROMPTS = ["a red cat on the street", "a blue dog in the sea", "a small bird", "a city at night"]
POLL_S = 0.01


def run_baseline(pipe, args) -> tuple[float, list[bytes]]:
    start = time.perf_counter()
    videos = []
    for seed in range(args.jobs):
        with torch.inference_mode():
            frames = pipe(
                prompt=PROMPTS[seed % len(PROMPTS)],
                height=args.size,
                width=args.size,
                num_frames=args.frames,
                num_inference_steps=args.steps,
                generator=torch.Generator().manual_seed(seed),
                output_type="np",
            ).frames[0]
        videos.append(encode_mp4((frames * 255).round().astype(np.uint8), 16.0))
    return time.perf_counter() - start, videos


def run_jobs(url: str, args) -> tuple[float, list[bytes]]:
    start = time.perf_counter()
    ids = []
    for seed in range(args.jobs):
        form = {
            "prompt": PROMPTS[seed % len(PROMPTS)],
            "size": f"{args.size}x{args.size}",
            "num_frames": str(args.frames),
            "num_inference_steps": str(args.steps),
            "seed": str(seed),
        }
        reply = requests.post(f"{url}/v1/videos", data=form, timeout=60)
        reply.raise_for_status()
        ids.append(reply.json()["id"])
    videos = []
    for video_id in ids:
        while (job := requests.get(f"{url}/v1/videos/{video_id}", timeout=60).json())[
            "status"
        ] not in ("completed", "failed"):
            time.sleep(POLL_S)
        if job["status"] == "failed":
            raise RuntimeError(f"job {video_id} failed: {job['error']}")
        content = requests.get(f"{url}/v1/videos/{video_id}/content", timeout=60)
        videos.append(content.content)
        requests.delete(f"{url}/v1/videos/{video_id}", timeout=60)
    return time.perf_counter() - start, videos


def frame_difference(served: list[bytes], baseline: list[bytes]) -> dict[str, float]:
    """Mean and largest per-pixel difference of the decoded videos (the same encoder on both
    sides, so the codec's loss is not counted twice)."""
    diffs = [
        np.abs(decode_mp4(a)[0].astype(int) - decode_mp4(b)[0].astype(int))
        for a, b in zip(served, baseline)
    ]
    return {
        "mean": float(np.mean([d.mean() for d in diffs])),
        "max": int(max(d.max() for d in diffs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="jobs in flight together")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from diffusers import DiffusionPipeline

    folder = build_tiny_models(default_models_dir(), ["wan2.1-t2v"])["wan2.1-t2v"]
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    fast = DiffusionPipeline.from_pretrained(folder)
    fast.set_progress_bar_config(disable=True)
    use_fast_norms(fast.vae)
    command = [str(BIN / "vllm"), "serve", str(folder), "--omni"]
    with ServerProcess(command) as server:
        one = argparse.Namespace(**{**vars(args), "jobs": 1})
        run_baseline(pipe, one)  # warm-up of each
        run_baseline(fast, one)
        run_jobs(server.url, one)
        runs = alternate(
            {
                "diffusers": lambda: run_baseline(pipe, args),
                "diffusers_fast_norms": lambda: run_baseline(fast, args),
                "omni": lambda: run_jobs(server.url, args),
            },
            args.pairs,
        )
    seconds = {arm: [s for s, _ in results] for arm, results in runs.items()}
    ratio = paired_ratio(seconds["diffusers"], seconds["omni"])
    ratio_fast = paired_ratio(seconds["diffusers_fast_norms"], seconds["omni"])
    diff = frame_difference(runs["omni"][0][1], runs["diffusers"][0][1])
    result = {
        "jobs": args.jobs,
        "size": args.size,
        "frames": args.frames,
        "steps": args.steps,
        **{f"{arm}_jobs_per_s": args.jobs / float(np.median(s)) for arm, s in seconds.items()},
        "seconds": seconds,
        "ratio": ratio,
        "ratio_to_fast_norms": ratio_fast,
        "frame_difference": diff,
    }
    base, ours = result["diffusers_jobs_per_s"], result["omni_jobs_per_s"]
    print(
        f"{args.jobs} jobs of {args.frames} frames at {args.size}x{args.size}, {args.steps} "
        f"steps: diffusers {base:.2f} jobs/s, with fast norms "
        f"{result['diffusers_fast_norms_jobs_per_s']:.2f}, /v1/videos {ours:.2f} jobs/s; ratio "
        f"{ratio['median']:.2f}x (median of {ratio['pairs']} rounds, geometric mean "
        f"{ratio['geomean']:.2f}x), {ratio_fast['median']:.2f}x to diffusers with fast norms; "
        f"decoded frames differ by {diff['mean']:.2f}/255 on average, {diff['max']}/255 at most"
    )
    write_result(args.json, result, dtype="float32")


if __name__ == "__main__":
    main()
