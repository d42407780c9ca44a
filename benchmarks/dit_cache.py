# SPDX-License-Identifier: Apache-2.0
"""First-block residual caching in the DiT stage: speed-up and PSNR, alone, under step-level
batching, and cache-dit (the peer) on the same weights, side by side in one run.

    python -m benchmarks.dit_cache --json out/dit_cache.json

Configurations (random weights; PSNR against the uncached same-seed image is a check of the
mechanism, not a claim about image quality):
- `tiny`: the tests' Qwen-Image pipeline as built (2-layer DiT), 128x128. Its random time
  embedding makes every block's residual jump between steps (relative L1 ~1), so nothing
  should be cached at sensible thresholds: a check that the signal has no false hits.
- `compute`: an 8-layer DiT of 6 heads of 64 at 256x256 (the transformer's arithmetic
  dominates; one forward ~0.15 s here), whose timestep embedding responds smoothly to t as
  trained ones do (`smooth_time_embedding_`), so neighbouring steps resemble each other.

Per configuration, 20 steps, `--prompts` prompts (seeds 0..n-1):
- alone: each prompt uncached, then at each threshold, interleaved prompt by prompt so drift
  hits all equally; DiT time is the denoising loop (the stage's step loop over QwenImageRunner),
  not the VAE; also on the transformer's calls alone, as cache-dit's figure is measured.
- batched: `--batch` requests in one step-level batch, request k joining at step 2k, uncached
  then each threshold, `--runs` times (median ratio); each request's image is also compared
  with the same request cached alone at that threshold (isolation, in 1/255 steps).
- cache-dit (if installed: `pip install cache-dit`): diffusers' QwenImagePipeline called per
  prompt, uncached vs cache-dit's DBCache F1B0 with the same threshold, warm-up, final steps
  and cap on consecutive cached steps; DiT time is the transformer's forward calls.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import write_result
from benchmarks.omni_throughput import wide_model
from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import ResidualCacheConfig
from vllm_omni.diffusion.step_loop import StepwiseExecutor
from vllm_omni.models.qwen_image.runner import QwenImageRunner
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

COMPUTE_DIT = dict(
    num_layers=8, attention_head_dim=64, num_attention_heads=6, axes_dims_rope=(16, 24, 24)
)
TIME_MAX_FREQUENCY = 3.0  # radians per unit of t: ~0.15 rad between neighbouring steps at 20
DEFAULT = ResidualCacheConfig()
THRESHOLDS = [0.12, DEFAULT.threshold, 0.36]  # --thresholds replaces it
PSNR_CAP = 100.0  # identical images: reported as 100 dB
SUBJECTS = ("a red cat", "a lighthouse at dusk", "two green apples", "a rainy city street")
SUBJECTS += ("a mountain lake", "an old bicycle", "a bowl of ramen", "a snowy forest")
STYLES = ("oil painting", "photo", "pencil sketch", "watercolor")
PROMPTS = [f"{s}, {style}" for s in SUBJECTS for style in STYLES]


@dataclass(frozen=True)
class Config:
    name: str
    size: int
    steps: int = 20


CONFIGS = (Config("tiny", 128), Config("compute", 256))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return PSNR_CAP if mse == 0 else min(PSNR_CAP, 10 * np.log10(255.0**2 / mse))


def speedups(base_s: list[float], seconds: list[float]) -> dict[str, float]:
    """Per-prompt seconds, uncached and cached, paired: total ratio, median pair ratio."""
    return {
        "speedup": sum(base_s) / sum(seconds),
        "speedup_median": statistics.median(b / c for b, c in zip(base_s, seconds)),
        "s_per_image": statistics.median(seconds),
    }


def psnr_stats(values: list[float]) -> dict[str, float]:
    return {"psnr_mean": statistics.fmean(values), "psnr_min": min(values)}


def max_diff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(int) - b.astype(int)).max())


class TransformerTimer:
    """Seconds spent in the transformer's calls, cached or not: what cache-dit's figure counts
    (the sampler's step and the runner's bookkeeping are left out of both sides)."""

    def __init__(self, runner: QwenImageRunner) -> None:
        self.seconds = 0.0
        self._cached = runner.cached_forward
        runner.cached_forward = self  # the runner calls it for requests with a cache policy
        transformer = runner.pipe.transformer
        transformer.register_forward_pre_hook(lambda *_: setattr(self, "_t0", time.perf_counter()))
        transformer.register_forward_hook(lambda *_: self._add(self._t0))

    def _add(self, start: float) -> None:
        self.seconds += time.perf_counter() - start

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._cached(*args, **kwargs)
        finally:
            self._add(start)


class Runner:
    """Drives the DiT stage's model runner directly: the denoising loop is what is timed (and,
    apart, the transformer's calls within it)."""

    def __init__(self, pipe) -> None:
        self.cache = DiTCacheManager()
        config = DiTConfig(model="in-memory")
        model = QwenImageRunner(pipe, config, torch.device("cpu"))
        self.timer = TransformerTimer(model)
        self.runner = StepwiseExecutor(config, self.cache, model)  # the stage's step loop
        self.pipe = pipe
        self._ids = 0

    def request(self, embeds, cfg: Config, seed: int, threshold: float) -> DiTRequest:
        self._ids += 1
        params = DiffusionSamplingParams(
            height=cfg.size,
            width=cfg.size,
            num_inference_steps=cfg.steps,
            seed=seed,
            cache_threshold=threshold,
        )
        return DiTRequest(f"r{self._ids}", params, {"prompt_embeds": embeds})

    def finish(self, request: DiTRequest) -> tuple[np.ndarray, int]:
        image = self.runner.decode([request])[request.request_id]
        cached = self.cache.get(request.request_id).state.get("fbcache_cached_steps", 0)
        self.cache.release(request.request_id)
        return image, cached

    def alone(self, embeds, cfg: Config, seed: int, threshold: float):
        request = self.request(embeds, cfg, seed, threshold)
        self.runner.prepare([request])
        start, in_transformer = time.perf_counter(), self.timer.seconds
        while not self.runner.is_done(request):
            self.runner.denoise_step([request])
        seconds = time.perf_counter() - start
        self.last_transformer_s = self.timer.seconds - in_transformer
        return (*self.finish(request), seconds)

    def batched(self, embeds: list, cfg: Config, threshold: float, join_every: int = 2):
        """Request k joins at engine step join_every*k; returns images, cached steps, seconds."""
        pending = [self.request(e, cfg, k, threshold) for k, e in enumerate(embeds)]
        running: list[DiTRequest] = []
        results: dict[int, tuple] = {}
        order = {r.request_id: k for k, r in enumerate(pending)}
        step, seconds = 0, 0.0
        while pending or running:
            while pending and order[pending[0].request_id] * join_every <= step:
                running.append(pending.pop(0))
                self.runner.prepare([running[-1]])
            start = time.perf_counter()
            self.runner.denoise_step(running)
            seconds += time.perf_counter() - start
            for request in [r for r in running if self.runner.is_done(r)]:
                running.remove(request)
                results[order[request.request_id]] = self.finish(request)
            step += 1
        return [results[k] for k in range(len(embeds))], seconds


def bench_alone(runner: Runner, embeds: list, cfg: Config) -> dict[str, Any]:
    runner.alone(embeds[0], cfg, 0, 0.0)  # warm-up
    runner.alone(embeds[0], cfg, 0, DEFAULT.threshold)
    base_s, base_t, base_images = [], [], []
    per = {t: {"seconds": [], "transformer": [], "psnr": [], "cached": []} for t in THRESHOLDS}
    for seed, e in enumerate(embeds):
        image, _, s = runner.alone(e, cfg, seed, 0.0)
        base_s.append(s)
        base_t.append(runner.last_transformer_s)
        base_images.append(image)
        for t in THRESHOLDS:
            cached_image, cached, s = runner.alone(e, cfg, seed, t)
            per[t]["seconds"].append(s)
            per[t]["transformer"].append(runner.last_transformer_s)
            per[t]["psnr"].append(psnr(cached_image, image))
            per[t]["cached"].append(cached / cfg.steps)
    rows = []
    for t in THRESHOLDS:
        p = per[t]
        rows.append(
            {
                "threshold": t,
                **speedups(base_s, p["seconds"]),
                "speedup_transformer": sum(base_t) / sum(p["transformer"]),
                **psnr_stats(p["psnr"]),
                "cached_fraction": statistics.fmean(p["cached"]),
            }
        )
    return {"uncached_s_per_image": statistics.median(base_s), "thresholds": rows}


def bench_batched(runner: Runner, embeds: list, cfg: Config, runs: int) -> dict[str, Any]:
    alone = {t: [runner.alone(e, cfg, k, t)[0] for k, e in enumerate(embeds)] for t in THRESHOLDS}
    per = {t: {"ratios": [], "psnr": [], "diff": [], "cached": []} for t in THRESHOLDS}
    base_s = []
    for _ in range(runs):
        uncached, seconds = runner.batched(embeds, cfg, 0.0)
        base_s.append(seconds)
        for t in THRESHOLDS:
            cached_out, cached_s = runner.batched(embeds, cfg, t)
            p = per[t]
            p["ratios"].append(seconds / cached_s)
            p["psnr"] = [psnr(c[0], u[0]) for c, u in zip(cached_out, uncached)]
            p["diff"] = [max_diff(c[0], a) for c, a in zip(cached_out, alone[t])]
            p["cached"] = [c[1] / cfg.steps for c in cached_out]
    rows = [
        {
            "threshold": t,
            "speedup_median": statistics.median(p["ratios"]),
            "speedups": p["ratios"],
            **psnr_stats(p["psnr"]),
            "cached_fraction": statistics.fmean(p["cached"]),
            "isolation_max_diff": max(p["diff"]),
        }
        for t, p in per.items()
    ]
    return {"requests": len(embeds), "uncached_s": statistics.median(base_s), "thresholds": rows}


def bench_cache_dit(folder: Path, prompts: list[str], cfg: Config) -> dict[str, Any] | None:
    try:
        import cache_dit
        from cache_dit import DBCacheConfig
    except ImportError:
        print("cache-dit not installed (pip install cache-dit): peer skipped", file=sys.stderr)
        return None
    from diffusers import QwenImagePipeline

    def load():
        pipe = QwenImagePipeline.from_pretrained(folder)
        pipe.set_progress_bar_config(disable=True)
        timer = {"s": 0.0}
        pipe.transformer.register_forward_pre_hook(
            lambda *_: timer.__setitem__("t0", time.perf_counter())
        )
        pipe.transformer.register_forward_hook(
            lambda *_: timer.__setitem__("s", timer["s"] + time.perf_counter() - timer["t0"])
        )
        return pipe, timer

    plain, plain_timer = load()
    cached = {}
    for threshold in THRESHOLDS:
        pipe, timer = load()
        # No guidance here: cache-dit would otherwise take every other transformer call for
        # the unconditional branch (Qwen-Image's adapter declares separate CFG calls).
        # The same policy as ours: warm-up and final steps computed (cache-dit's step mask,
        # dynamic decisions in between), the same cap on consecutive cached steps.
        mask = [1] * DEFAULT.warmup_steps
        mask += [0] * (cfg.steps - DEFAULT.warmup_steps - DEFAULT.final_steps)
        mask += [1] * DEFAULT.final_steps
        config = DBCacheConfig(
            Fn_compute_blocks=1,
            Bn_compute_blocks=0,
            residual_diff_threshold=threshold,
            max_warmup_steps=DEFAULT.warmup_steps,
            max_continuous_cached_steps=DEFAULT.max_consecutive,
            enable_separate_cfg=False,
            num_inference_steps=cfg.steps,
            steps_computation_mask=mask,
            steps_computation_policy="dynamic",
        )
        cache_dit.enable_cache(pipe, cache_config=config)
        cached[threshold] = (pipe, timer)

    def call(pipe, timer, prompt: str, seed: int):
        before = timer["s"]
        image = pipe(
            prompt,
            height=cfg.size,
            width=cfg.size,
            num_inference_steps=cfg.steps,
            true_cfg_scale=1.0,
            generator=torch.Generator().manual_seed(seed),
        ).images[0]
        return np.asarray(image), timer["s"] - before

    call(plain, plain_timer, prompts[0], 0)  # warm-up
    for pipe, timer in cached.values():
        call(pipe, timer, prompts[0], 0)
    base_s = []
    per = {t: {"seconds": [], "psnr": []} for t in THRESHOLDS}
    for seed, prompt in enumerate(prompts):
        ref, s = call(plain, plain_timer, prompt, seed)
        base_s.append(s)
        for t, (pipe, timer) in cached.items():
            image, s = call(pipe, timer, prompt, seed)
            per[t]["seconds"].append(s)
            per[t]["psnr"].append(psnr(image, ref))
    rows = [
        {
            "threshold": t,
            **speedups(base_s, p["seconds"]),
            **psnr_stats(p["psnr"]),
        }
        for t, p in per.items()
    ]
    return {
        "version": getattr(cache_dit, "__version__", "?"),
        "config": "DBCache F1B0, same warm-up, final steps and consecutive cap; no separate CFG",
        "uncached_s_per_image": statistics.median(base_s),
        "thresholds": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="requests in the batched run")
    parser.add_argument("--runs", type=int, default=2, help="batched runs (median)")
    parser.add_argument("--configs", nargs="+", default=[c.name for c in CONFIGS])
    parser.add_argument(
        "--thresholds", nargs="+", type=float, default=list(THRESHOLDS), help="the sweep"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    THRESHOLDS[:] = args.thresholds
    from diffusers import QwenImagePipeline

    tiny = build_tiny_models(default_models_dir(), ["qwen-image"])["qwen-image"]
    folders = {
        "tiny": tiny,
        "compute": wide_model(
            tiny, COMPUTE_DIT, "bench-qwen-image-cache", time_max_frequency=TIME_MAX_FREQUENCY
        ),
    }
    prompts = PROMPTS[: args.prompts]
    out: dict[str, Any] = {
        "policy": {**DEFAULT.__dict__},
        "threads": torch.get_num_threads(),
        "configs": {},
    }
    for cfg in CONFIGS:
        if cfg.name not in args.configs:
            continue
        pipe = QwenImagePipeline.from_pretrained(folders[cfg.name])
        pipe.set_progress_bar_config(disable=True)
        with torch.inference_mode():
            embeds = [pipe.encode_prompt(p, device=torch.device("cpu"))[0][0] for p in prompts]
        runner = Runner(pipe)
        result = {"size": cfg.size, "steps": cfg.steps, "prompts": len(prompts)}
        result["alone"] = bench_alone(runner, embeds, cfg)
        result["batched"] = bench_batched(runner, embeds[: args.batch], cfg, args.runs)
        result["cache_dit"] = bench_cache_dit(folders[cfg.name], prompts, cfg)
        out["configs"][cfg.name] = result
        report(cfg.name, result)
    write_result(args.json, out, dtype="float32")


def report(name: str, r: dict[str, Any]) -> None:
    alone = r["alone"]
    print(
        f"\n{name}: {r['size']}x{r['size']}, {r['steps']} steps, {r['prompts']} prompts, "
        f"uncached {alone['uncached_s_per_image']:.2f} s/image (DiT)"
    )
    head = ("", "speed-up", "median", "s/image", "PSNR mean", "min", "cached", "isolation")
    print("{:24}{:>9}{:>8}{:>9}{:>11}{:>7}{:>8}{:>11}".format(*head))
    line = "{:24}{:>9.2f}{:>8}{:>9}{:>11.1f}{:>7.1f}{:>8}{:>11}"
    for row in alone["thresholds"]:
        print(
            line.format(
                f"  alone      tau={row['threshold']}",
                row["speedup"],
                f"{row['speedup_median']:.2f}",
                f"{row['s_per_image']:.2f}",
                row["psnr_mean"],
                row["psnr_min"],
                f"{row['cached_fraction']:.0%}",
                "",
            )
        )
    for row in alone["thresholds"]:
        print(
            f"  alone      tau={row['threshold']}: {row['speedup_transformer']:.2f}x on the "
            "transformer's calls alone (what cache-dit's figure counts)"
        )
    for row in r["batched"]["thresholds"]:
        print(
            line.format(
                f"  batched    tau={row['threshold']}",
                row["speedup_median"],
                "",
                "",
                row["psnr_mean"],
                row["psnr_min"],
                f"{row['cached_fraction']:.0%}",
                f"{row['isolation_max_diff']}/255",
            )
        )
    c = r["cache_dit"]
    if c is not None:
        for row in c["thresholds"]:
            print(
                line.format(
                    f"  cache-dit  tau={row['threshold']}",
                    row["speedup"],
                    f"{row['speedup_median']:.2f}",
                    f"{row['s_per_image']:.2f}",
                    row["psnr_mean"],
                    row["psnr_min"],
                    "",
                    "",
                )
            )
        print(
            f"  (cache-dit {c['version']}: {c['config']}; uncached "
            f"{c['uncached_s_per_image']:.2f} s/image)"
        )


if __name__ == "__main__":
    main()
