# SPDX-License-Identifier: Apache-2.0
"""Text-to-image throughput: diffusers' pipeline called once per prompt vs OmniLLM.

    python -m benchmarks.omni_throughput --json out/omni.json --png out/omni.png

Two configurations, 16 prompts each (seeds 0..15), in one run:
- `tiny`: the tiny Qwen-Image pipeline of the tests (2-layer DiT, 2 heads of 32), 128x128.
- `compute`: the same pipeline with a wider, deeper DiT (6 layers, 8 heads of 64), 256x256,
  so that the transformer's arithmetic, not Python overhead, dominates.

The baseline is what a diffusers user writes: `pipe(prompt, ...)` for each prompt in turn, in
this process, with torch's default threads. OmniLLM runs its default stage graph: the text
encoder on a vLLM engine, then the DiT (step-level batching, batched VAE decode) in a process
of its own; requests overlap across the two. The machines
here drift 10-25% between runs, so runs are paired: each baseline pass is followed by an
OmniLLM pass over the same prompts, and the ratio is taken per pair (median of --runs pairs,
after a warm-up pass of each). Reported: images/s, the ratio, the largest pixel difference
between the two for the same prompt and seed, and (--png) a timeline of stage utilisation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import write_result
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

WIDE_DIT = dict(
    num_layers=6, attention_head_dim=64, num_attention_heads=8, axes_dims_rope=(16, 24, 24)
)
PROMPTS = [
    f"{subject}, {style}"
    for subject in (
        "a red cat on a blue sofa",
        "a lighthouse at dusk",
        "two green apples",
        "a city street in the rain",
    )
    for style in ("oil painting", "photo", "pencil sketch", "watercolor, soft light")
]


@dataclass(frozen=True)
class Config:
    name: str
    size: int
    steps: int
    wide: bool


CONFIGS = {
    "tiny": Config("tiny", size=128, steps=20, wide=False),
    "compute": Config("compute", size=256, steps=20, wide=True),
}


@dataclass
class Result:
    config: Config
    num_prompts: int
    baseline_s: list[float] = field(default_factory=list)
    omni_s: list[float] = field(default_factory=list)
    max_pixel_diff: int = -1
    omni_start_s: float = 0.0
    timeline: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        n = self.num_prompts
        ratios = [b / o for b, o in zip(self.baseline_s, self.omni_s)]
        return {
            "config": self.config.__dict__,
            "num_prompts": n,
            "baseline_images_per_s": n / statistics.median(self.baseline_s),
            "omni_images_per_s": n / statistics.median(self.omni_s),
            "ratio_median": statistics.median(ratios),
            "ratios": ratios,
            "baseline_s": self.baseline_s,
            "omni_s": self.omni_s,
            "max_pixel_diff": self.max_pixel_diff,
            "omni_start_s": self.omni_start_s,
        }


def wide_model(
    tiny: Path,
    dit: dict[str, Any] = WIDE_DIT,
    name: str = "bench-qwen-image-wide",
    time_max_frequency: float | None = None,
) -> Path:
    """The tiny pipeline with a wider DiT (`dit`: transformer config), built once under `name`
    (deterministic weights). `time_max_frequency`: see `smooth_time_embedding_`."""
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

    from vllm_omni.models.qwen_image.tiny import QWEN_IMAGE_SEED
    from vllm_omni.testing.tiny_common import randomize_, smooth_time_embedding_

    out = default_models_dir() / name
    stamp = out / ".complete"
    key = json.dumps([dit, time_max_frequency], sort_keys=True) + (tiny / ".complete").read_text()
    if stamp.is_file() and stamp.read_text() == key:
        return out
    pipe = QwenImagePipeline.from_pretrained(tiny)
    old = pipe.transformer.config
    transformer = QwenImageTransformer2DModel(
        patch_size=old.patch_size,
        in_channels=old.in_channels,
        out_channels=old.out_channels,
        joint_attention_dim=old.joint_attention_dim,
        **dit,
    )
    randomize_(transformer, QWEN_IMAGE_SEED + 11)
    if time_max_frequency is not None:
        smooth_time_embedding_(transformer, time_max_frequency)
    pipe.transformer = transformer
    pipe.register_modules(transformer=transformer)
    pipe.save_pretrained(out)
    for name in ("tokenizer_config.json", "tokenizer.json"):  # the vLLM text encoder's tokenizer
        if (tiny / "text_encoder" / name).is_file():
            (out / "text_encoder" / name).write_bytes((tiny / "text_encoder" / name).read_bytes())
    stamp.write_text(key)
    return out


def run_baseline(
    pipe, prompts: list[str], cfg: Config, timeline: list | None = None
) -> tuple[float, list]:
    images = []
    start = time.perf_counter()
    for seed, prompt in enumerate(prompts):
        t0 = time.monotonic()
        images.append(
            pipe(
                prompt,
                height=cfg.size,
                width=cfg.size,
                num_inference_steps=cfg.steps,
                generator=torch.Generator().manual_seed(seed),
            ).images[0]
        )
        if timeline is not None:
            timeline.append((t0, time.monotonic()))
    return time.perf_counter() - start, images


def run_omni(omni, prompts: list[str], cfg: Config) -> tuple[float, list]:
    from vllm_omni import DiffusionSamplingParams

    start = time.perf_counter()
    futures = [
        omni.add_request(
            prompt,
            DiffusionSamplingParams(
                height=cfg.size, width=cfg.size, num_inference_steps=cfg.steps, seed=seed
            ),
        )
        for seed, prompt in enumerate(prompts)
    ]
    outputs = [f.result() for f in futures]
    return time.perf_counter() - start, outputs


def bench(cfg: Config, model: Path, num_prompts: int, runs: int) -> Result:
    from diffusers import QwenImagePipeline

    from vllm_omni import OmniLLM

    prompts = (PROMPTS * ((num_prompts + len(PROMPTS) - 1) // len(PROMPTS)))[:num_prompts]
    result = Result(cfg, num_prompts)
    pipe = QwenImagePipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    omni = OmniLLM(model)
    result.omni_start_s = time.perf_counter() - start
    try:
        _, base_images = run_baseline(pipe, prompts[:2], cfg)  # warm-up
        _, outputs = run_omni(omni, prompts[:2], cfg)
        result.max_pixel_diff = max(
            int(np.abs(np.asarray(a).astype(int) - np.asarray(b.images[0]).astype(int)).max())
            for a, b in zip(base_images, outputs)
        )
        for i in range(runs):
            base_timeline: list = []
            b, _ = run_baseline(pipe, prompts, cfg, base_timeline)
            mark = time.monotonic()
            o, _ = run_omni(omni, prompts, cfg)
            result.baseline_s.append(b)
            result.omni_s.append(o)
            print(
                f"[{cfg.name}] run {i + 1}: diffusers {b:.2f} s, OmniLLM {o:.2f} s, "
                f"ratio {b / o:.2f}",
                flush=True,
            )
        result.timeline = {"diffusers (sequential)": _shift(base_timeline, base_timeline[0][0])}
        for name, stage in omni.engine.stages.items():
            result.timeline[f"omni: {name}"] = _shift(
                [iv for iv in stage.busy.intervals if iv[1] > mark], mark
            )
    finally:
        omni.shutdown()
    return result


def _shift(intervals, origin: float) -> list[tuple[float, float]]:
    return [(max(0.0, s - origin), e - origin) for s, e in intervals]


def write_png(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.2 * len(results) + 0.6), squeeze=False)
    for ax, res in zip(axes[:, 0], results):
        rows = list(res.timeline.items())
        for y, (label, intervals) in enumerate(rows):
            ax.broken_barh(
                [(s, e - s) for s, e in intervals],
                (y - 0.35, 0.7),
                color="tab:gray" if y == 0 else f"C{y}",
                edgecolor="white",
                linewidth=0.3,
            )
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.invert_yaxis()
        s = res.summary()
        ax.set_title(
            f"{res.config.name}: {res.config.size}x{res.config.size}, {res.config.steps} steps, "
            f"{res.num_prompts} prompts - diffusers {s['baseline_images_per_s']:.2f} img/s, "
            f"OmniLLM {s['omni_images_per_s']:.2f} img/s ({s['ratio_median']:.2f}x)",
            fontsize=9,
        )
        ax.set_xlabel("seconds (last run; each row from its own start)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,compute", help=f"comma list of {list(CONFIGS)}")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--png", type=Path, help="write the stage-utilisation timeline here")
    args = parser.parse_args()

    tiny = build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"]
    results = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        model = wide_model(tiny) if cfg.wide else tiny
        results.append(bench(cfg, model, args.num_prompts, args.runs))

    print(
        "\nconfig    size  steps  diffusers img/s  OmniLLM img/s  ratio (median of pairs)"
        "  max px diff"
    )
    for res in results:
        s = res.summary()
        print(
            f"{res.config.name:8s} {res.config.size:5d} {res.config.steps:6d} "
            f"{s['baseline_images_per_s']:16.2f} {s['omni_images_per_s']:14.2f} "
            f"{s['ratio_median']:11.2f}x {'':12s}{s['max_pixel_diff']:3d}"
        )
    write_result(args.json, {r.config.name: r.summary() for r in results}, dtype="float32")
    if args.png:
        write_png(results, args.png)


if __name__ == "__main__":
    main()
