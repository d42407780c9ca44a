# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image VAE decode of still images: diffusers' own path vs vllm_omni's single-frame path.

    python -m benchmarks.vae_decode --json out/vae_decode.json

Both VAEs load the same weights (the tiny Qwen-Image's, or `--model DIR` for any Qwen-Image
pipeline folder); each size is decoded alternately by the two, `--runs` times, after a warm-up.
Printed per size and batch: median milliseconds of each, their ratio, and the largest difference
between the two decodes (both take the same latents).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import write_result
from vllm_omni.models.qwen_image.vae_fast_path import accelerate_vae
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

SIZES = (64, 192, 512)


def timed_ms(vae, z: torch.Tensor) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = vae.decode(z, return_dict=False)[0]
    return (time.perf_counter() - start) * 1000, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a Qwen-Image pipeline folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from diffusers import AutoencoderKLQwenImage

    folder = args.model or build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"]
    stock = AutoencoderKLQwenImage.from_pretrained(folder / "vae")
    fast = AutoencoderKLQwenImage.from_pretrained(folder / "vae")
    accelerate_vae(fast)
    factor = 2 ** len(stock.temperal_downsample)
    rows = []
    for size in args.sizes:
        z = torch.randn(args.batch, stock.config.z_dim, 1, size // factor, size // factor)
        timed_ms(stock, z), timed_ms(fast, z)  # warm-up
        times: dict[str, list[float]] = {"diffusers": [], "vllm_omni": []}
        for _ in range(args.runs):
            ms, ref = timed_ms(stock, z)
            times["diffusers"].append(ms)
            ms, ours = timed_ms(fast, z)
            times["vllm_omni"].append(ms)
        row = {
            "size": size,
            "batch": args.batch,
            **{f"{k}_ms": statistics.median(v) for k, v in times.items()},
            "max_abs_diff": (ours - ref).abs().max().item(),
        }
        row["speedup"] = row["diffusers_ms"] / row["vllm_omni_ms"]
        rows.append(row)
        print(
            f"{size}x{size} x{args.batch}: diffusers {row['diffusers_ms']:.1f} ms, "
            f"vllm_omni {row['vllm_omni_ms']:.1f} ms, {row['speedup']:.2f}x, "
            f"max |diff| {row['max_abs_diff']:.1e} (images in [-1, 1])"
        )
    model = str(args.model) if args.model else "tiny:qwen-image"  # no machine's paths
    out = {"args": vars(args) | {"json": str(args.json), "model": model},
           "threads": torch.get_num_threads(), "rows": rows}  # fmt: skip
    write_result(args.json, out, dtype="float32")


if __name__ == "__main__":
    main()
