# SPDX-License-Identifier: Apache-2.0
"""Image-edit throughput: diffusers' Qwen-Image-Edit called once per request vs OmniLLM with
the requests in flight together.

    python -m benchmarks.image_edits --json docs/results/image_edits.json

The tiny Qwen-Image-Edit pipeline of the tests edits one seeded input picture for `--requests`
prompts (seeds 0..n-1), at `--size` with `--steps` steps. The baseline is what a diffusers user
writes: `pipe(image=..., prompt=..., ...)` for each request in turn, in this process, its text
encoder given the model's image positions (vllm_omni.models.qwen_image.edit.reference). OmniLLM
runs its built-in graph for the model: Qwen2.5-VL on vLLM, then the DiT step-batched with the
image's VAE latents as conditioning. The two arms alternate
(`benchmarks.common.alternate`) over `--pairs` pairs after a warm-up of each; reported: requests
per second of each, the ratio per pair (median and geometric mean), and the largest pixel
difference between the two for the same request and seed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.common import alternate, paired_ratio, write_result
from vllm_omni.models.qwen_image.edit.reference import with_image_positions
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

PROMPTS = ["make it red", "add a hat", "turn it into a sketch", "make it night", "add rain"]


def picture(size: int = 96) -> Image.Image:
    rng = np.random.default_rng(0)
    coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((size, size), Image.BILINEAR)


def run_baseline(pipe, image, prompts: list[str], args) -> tuple[float, list]:
    start = time.perf_counter()
    images = []
    for seed, prompt in enumerate(prompts):
        with torch.inference_mode():
            out = pipe(
                image=image,
                prompt=prompt,
                height=args.size,
                width=args.size,
                num_inference_steps=args.steps,
                generator=torch.Generator().manual_seed(seed),
            )
        images.append(out.images[0])
    return time.perf_counter() - start, images


def run_omni(omni, image, prompts: list[str], args) -> tuple[float, list]:
    from vllm_omni import DiffusionSamplingParams

    params = [
        DiffusionSamplingParams(
            height=args.size, width=args.size, num_inference_steps=args.steps, seed=seed
        )
        for seed in range(len(prompts))
    ]
    start = time.perf_counter()
    requests = [{"prompt": p, "image": image} for p in prompts]
    outputs = omni.generate(requests, params, use_tqdm=False)
    return time.perf_counter() - start, [out.images[0] for out in outputs]


def max_pixel_diff(a: list, b: list) -> int:
    return max(
        int(np.abs(np.asarray(x).astype(int) - np.asarray(y).astype(int)).max())
        for x, y in zip(a, b)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8, help="edits in flight together")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from diffusers import DiffusionPipeline

    from vllm_omni import OmniLLM

    folder = build_tiny_models(default_models_dir(), ["qwen-image-edit"])["qwen-image-edit"]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    image = picture()
    pipe = with_image_positions(DiffusionPipeline.from_pretrained(folder))
    pipe.set_progress_bar_config(disable=True)
    with OmniLLM(folder) as omni:
        run_baseline(pipe, image, prompts[:1], args)  # warm-up of each
        run_omni(omni, image, prompts[:1], args)
        runs = alternate(
            {
                "diffusers": lambda: run_baseline(pipe, image, prompts, args),
                "omni": lambda: run_omni(omni, image, prompts, args),
            },
            args.pairs,
        )
    seconds = {arm: [s for s, _ in results] for arm, results in runs.items()}
    ratio = paired_ratio(seconds["diffusers"], seconds["omni"])
    diff = max_pixel_diff(runs["diffusers"][0][1], runs["omni"][0][1])
    result = {
        "requests": args.requests,
        "size": args.size,
        "steps": args.steps,
        "diffusers_requests_per_s": args.requests / float(np.median(seconds["diffusers"])),
        "omni_requests_per_s": args.requests / float(np.median(seconds["omni"])),
        "seconds": seconds,
        "ratio": ratio,
        "max_pixel_diff": diff,
    }
    base, ours = result["diffusers_requests_per_s"], result["omni_requests_per_s"]
    print(
        f"{args.requests} edits of {args.size}x{args.size}, {args.steps} steps: diffusers "
        f"{base:.2f} req/s, OmniLLM {ours:.2f} req/s; ratio {ratio['median']:.2f}x (median of "
        f"{ratio['pairs']} pairs, geometric mean {ratio['geomean']:.2f}x); max pixel difference "
        f"{diff}/255"
    )
    write_result(args.json, result, dtype="float32")


if __name__ == "__main__":
    main()
