# SPDX-License-Identifier: Apache-2.0
"""What this project's vLLM-free parts do on one GPU, in a few minutes, with nothing downloaded.

    python -m benchmarks.gpu_check --json out/gpu_check.json --md out/gpu_check.md
    python -m benchmarks.gpu_check --dry-run        # CPU, tiny shapes, seconds (CI runs this)

Written for a single-GPU machine that has PyTorch, Triton and transformers but neither vLLM nor a
network, where only small wheels can be brought along: vLLM's CUDA wheel cannot, diffusers can
(`pip download --no-deps diffusers==0.42.*` here, `pip install --no-deps diffusers-*.whl` there).
So everything below runs without vLLM, and the script fails if any vLLM module got imported.

1. **DiT stage** (`DiffusionEngineCore`, step-level batching): a Qwen-Image transformer of the
   full size (60 blocks, 24 heads of 128, text width 3584; random weights) at 1024x1024, a few
   denoising steps for a burst of requests with different prompts and seeds, against plain
   diffusers `QwenImagePipeline` calls one request after the other: wall time of each, the
   stage's per-step times, and how far the stage's latents are from diffusers' (batching changes
   kernel shapes; in bfloat16 that moves the result a little, it is not meant to be bit-equal).
   The VAE is a shrunk one of Qwen-Image's architecture: the check is about the transformer.
2. **Chunk-cost profile** of a Llama-3-8B decoder layer in plain PyTorch (RMSNorm, fused QKV, GQA
   attention with flash attention's lower-right causal mask over a growing cached context, SwiGLU
   MLP): seconds per chunk of n new tokens after c cached ones, fitted with the project's
   `CostModel` (relative RMS error reported), scaled to 32 / p layers per stage.
3. **Projection**: that fitted model in the CPP simulator for p = 4 and 8 at 128K-1M tokens:
   fixed 4096-token chunks against CPP's plan (`cpp_plan`), with vLLM's p steps in flight. Only
   layers are modelled (no sampler, no inter-stage transfer): an upper bound on what CPP gains.

Parts that would not finish within `--budget-s` are skipped and say so.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


class _NoVllm:
    """Hides vLLM, as on the machine this is written for, also where it is installed (CI's dry
    run): any vLLM import below fails, so the dry run proves the DiT stage needs none."""

    def find_spec(self, name: str, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(f"gpu_check runs without vLLM ({name})", name=name)
        return None


sys.meta_path.insert(0, _NoVllm())

from benchmarks.common import write_result  # noqa: E402
from vllm_omni.cpp.chunking import cpp_plan  # noqa: E402
from vllm_omni.cpp.cost_model import CostModel, ModelShape, StepSample  # noqa: E402
from vllm_omni.cpp.simulator import fixed_chunks, simulate  # noqa: E402

K = 1024


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Everything the two modes differ in."""

    dit: dict[str, Any]  # QwenImageTransformer2DModel arguments
    image_size: int
    num_requests: int
    num_steps: int
    text_lengths: tuple[int, ...]  # prompt lengths, cycled over the requests
    layer: ModelShape  # num_layers: the whole model's, for the projection
    contexts: tuple[int, ...]
    chunks: tuple[int, ...]
    repeats: int
    prompt_lengths: tuple[int, ...]
    pp_sizes: tuple[int, ...]
    fixed_chunk: int


FULL = Sizes(
    # Qwen-Image's transformer (diffusers' QwenImageTransformer2DModel defaults, 20B parameters).
    dit=dict(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=60,
        attention_head_dim=128,
        num_attention_heads=24,
        joint_attention_dim=3584,
        axes_dims_rope=(16, 56, 56),
    ),
    image_size=1024,
    num_requests=4,
    num_steps=6,
    text_lengths=(77, 120, 64, 150),
    layer=ModelShape.llama3_8b(),
    contexts=(0, 8 * K, 32 * K, 128 * K, 512 * K),
    chunks=(256, 1 * K, 2 * K, 4 * K, 8 * K, 16 * K),
    repeats=3,
    prompt_lengths=(128 * K, 256 * K, 512 * K, 1024 * K),
    pp_sizes=(4, 8),
    fixed_chunk=4 * K,
)

# --dry-run: the same architectures at tiny shapes (CPU, seconds); the rest as FULL.
DRY = dataclasses.replace(
    FULL,
    dit=FULL.dit
    | dict(
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=64,
        axes_dims_rope=(8, 12, 12),
    ),
    image_size=128,
    num_requests=2,
    num_steps=2,
    text_lengths=(7, 12),
    layer=ModelShape(8, 256, 4, 2, 64, 512, 1000),
    contexts=(0, 256, 1 * K),
    chunks=(64, 128, 256),
    repeats=1,
    prompt_lengths=(128 * K, 1024 * K),
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Seconds since start, and whether an estimated amount of work still fits the budget."""

    def __init__(self, budget_s: float) -> None:
        self.start = time.perf_counter()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.budget_s


# ----------------------------------------------------------------------------- 1. DiT stage


def _pipeline(sizes: Sizes, device: torch.device, dtype: torch.dtype):
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

    from vllm_omni.models.qwen_image.tiny import qwen_image_scheduler, qwen_image_vae

    torch.manual_seed(0)
    # Built in float32 on the device, then cast parameter by parameter: peak memory is the
    # float32 model, never float32 and bfloat16 copies of all of it at once.
    with torch.device(device):
        transformer = QwenImageTransformer2DModel(**sizes.dit)
        vae = qwen_image_vae()
    if dtype != torch.float32:
        transformer.to(dtype)
    pipe = QwenImagePipeline(
        scheduler=qwen_image_scheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _requests(sizes: Sizes, text_width: int, dtype: torch.dtype) -> list[tuple[str, Any, Any]]:
    from vllm_omni.diffusion.params import DiffusionSamplingParams

    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(sizes.num_requests):
        n = sizes.text_lengths[i % len(sizes.text_lengths)]
        embeds = torch.randn(n, text_width, generator=gen).to(dtype)
        params = DiffusionSamplingParams(
            height=sizes.image_size,
            width=sizes.image_size,
            num_inference_steps=sizes.num_steps,
            seed=100 + i,
            output_type="latent",
        )
        out.append((f"req-{i}", embeds, params))
    return out


def _run_stage(core, requests) -> tuple[dict[str, torch.Tensor], list[float], float]:
    """All requests at once through the stage's loop; results, per-step seconds, wall seconds."""
    device = core.executor.runner.device
    _sync(device)
    start = time.perf_counter()
    for request_id, embeds, params in requests:
        core.add_request(request_id, {"prompt_embeds": embeds}, params)
    results, steps = {}, []
    while core.has_unfinished_requests():
        finished, step_start, step_end = core.step()
        steps.append(step_end - step_start)
        results.update({r.request_id: out for r, out in finished})
    _sync(device)
    return results, steps, time.perf_counter() - start


def _run_diffusers(pipe, requests, device) -> tuple[dict[str, torch.Tensor], float]:
    """The same requests as plain diffusers calls, one after the other."""
    _sync(device)
    start = time.perf_counter()
    results = {}
    for request_id, embeds, params in requests:
        latents = pipe(
            prompt_embeds=embeds[None].to(device),
            prompt_embeds_mask=torch.ones(1, embeds.shape[0], dtype=torch.long, device=device),
            height=params.height,
            width=params.width,
            num_inference_steps=params.num_inference_steps,
            true_cfg_scale=1.0,
            generator=torch.Generator(device="cpu").manual_seed(params.seed),
            output_type="latent",
        ).images
        results[request_id] = latents[0].float().cpu()
    _sync(device)
    return results, time.perf_counter() - start


def check_dit(sizes: Sizes, device: torch.device, dtype: torch.dtype, clock: Clock) -> dict:
    from vllm_omni.diffusion.config import DiTConfig
    from vllm_omni.diffusion.engine_core import DiffusionEngineCore

    start = time.perf_counter()
    pipe = _pipeline(sizes, device, dtype)
    _sync(device)
    build_s = time.perf_counter() - start
    params_b = sum(p.numel() for p in pipe.transformer.parameters()) / 1e9
    config = DiTConfig(
        model="in-memory Qwen-Image transformer (random weights)",
        device=str(device),
        max_num_seqs=sizes.num_requests,
    )
    core = DiffusionEngineCore(config, "step", "qwen_image", pipe=pipe)
    requests = _requests(sizes, sizes.dit["joint_attention_dim"], dtype)

    # Warm-up (kernel selection, allocator) on one request of the same size, both paths.
    warm = [(name + "-warm", e, p) for name, e, p in requests[:1]]
    _, warm_steps, warm_s = _run_stage(core, warm)
    _run_diffusers(pipe, warm, device)
    estimate = 3 * warm_s * sizes.num_requests  # the stage's burst, diffusers' calls, margin
    result: dict[str, Any] = {
        "transformer_params_billion": round(params_b, 2),
        "build_s": round(build_s, 1),
        "image_size": sizes.image_size,
        "image_tokens": (sizes.image_size // 16) ** 2,
        "num_requests": sizes.num_requests,
        "num_steps": sizes.num_steps,
        "dtype": str(dtype).removeprefix("torch."),
    }
    if not clock.fits(estimate):
        result["skipped"] = f"about {estimate:.0f} s more would exceed --budget-s"
        return result
    stage, step_s, stage_s = _run_stage(core, requests)
    reference, diffusers_s = _run_diffusers(pipe, requests, device)
    diffs = []
    for request_id, ref in reference.items():
        got = torch.as_tensor(stage[request_id]).float()
        diffs.append(float((got - ref).norm() / ref.norm().clamp_min(1e-12)))
    images = sizes.num_requests
    result |= {
        "single_request_step_s": round(statistics.median(warm_steps), 4),
        "batched_step_s_median": round(statistics.median(step_s), 4),
        "stage_s": round(stage_s, 3),
        "diffusers_sequential_s": round(diffusers_s, 3),
        "stage_images_per_s": round(images / stage_s, 3),
        "diffusers_images_per_s": round(images / diffusers_s, 3),
        "speedup_vs_diffusers": round(diffusers_s / stage_s, 3),
        "latent_rel_l2_vs_diffusers_max": max(diffs),
        "finite": all(bool(torch.as_tensor(v).isfinite().all()) for v in stage.values()),
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
    del core, pipe
    return result


# ----------------------------------------------------------------------------- 2. layer profile


class DecoderLayer(torch.nn.Module):
    """One Llama-style decoder layer in plain PyTorch, prefilling a chunk after a KV cache."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
        self.q_width, self.kv_width = q, kv
        self.norm1 = torch.nn.RMSNorm(shape.hidden_size)
        self.qkv = torch.nn.Linear(shape.hidden_size, q + 2 * kv, bias=False)
        self.o = torch.nn.Linear(q, shape.hidden_size, bias=False)
        self.norm2 = torch.nn.RMSNorm(shape.hidden_size)
        self.gate_up = torch.nn.Linear(shape.hidden_size, 2 * shape.intermediate_size, bias=False)
        self.down = torch.nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cached: int):
        """x: [n, hidden]; caches: [1, kv_heads, capacity, head_dim], the first `cached`
        positions filled. Writes this chunk's keys and values after them, as a KV cache would."""
        from torch.nn.attention.bias import causal_lower_right

        s, n = self.shape, x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).split([self.q_width, self.kv_width, self.kv_width], -1)
        end = cached + n
        k_cache[0, :, cached:end] = k.view(n, s.num_kv_heads, s.head_dim).transpose(0, 1)
        v_cache[0, :, cached:end] = v.view(n, s.num_kv_heads, s.head_dim).transpose(0, 1)
        attn = torch.nn.functional.scaled_dot_product_attention(
            q.view(1, n, s.num_heads, s.head_dim).transpose(1, 2),
            k_cache[:, :, :end],
            v_cache[:, :, :end],
            attn_mask=causal_lower_right(n, end),
            enable_gqa=True,
        )
        x = x + self.o(attn[0].transpose(0, 1).reshape(n, self.q_width))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


def _flash_usable(shape: ModelShape, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether SDPA takes flash attention for a lower-right causal GQA call (else it would
    materialise an n x (c + n) mask, impossible at these contexts on any GPU)."""
    from torch.backends.cuda import SDPAParams, can_use_flash_attention

    if device.type != "cuda":
        return False
    q = torch.empty(1, shape.num_heads, 16, shape.head_dim, device=device, dtype=dtype)
    kv = torch.empty(1, shape.num_kv_heads, 32, shape.head_dim, device=device, dtype=dtype)
    return bool(can_use_flash_attention(SDPAParams(q, kv, kv, None, 0.0, False, True)))


@torch.inference_mode()
def profile_layer(sizes: Sizes, device: torch.device, dtype: torch.dtype, clock: Clock) -> dict:
    shape = sizes.layer
    flash = _flash_usable(shape, device, dtype)
    if device.type == "cuda" and not flash:
        return {"skipped": "flash attention is not usable for lower-right causal GQA here"}
    torch.manual_seed(0)
    with torch.device(device):
        layer = DecoderLayer(shape).to(dtype)
    capacity = max(sizes.contexts) + max(sizes.chunks)
    cache_shape = (1, shape.num_kv_heads, capacity, shape.head_dim)
    k_cache = torch.randn(cache_shape, device=device, dtype=dtype)
    v_cache = torch.randn(cache_shape, device=device, dtype=dtype)
    layer(
        torch.randn(max(sizes.chunks), shape.hidden_size, device=device, dtype=dtype),
        k_cache,
        v_cache,
        0,
    )  # start-up costs (library loading, allocator) before timing
    samples, rows = [], []
    for cached in sizes.contexts:
        for n in sizes.chunks:
            if not clock.fits(5.0):
                rows.append({"cached": cached, "chunk": n, "skipped": "budget"})
                continue
            x = torch.randn(n, shape.hidden_size, device=device, dtype=dtype)
            layer(x, k_cache, v_cache, cached)  # warm-up: kernel choice for this shape
            times = []
            for _ in range(sizes.repeats):
                _sync(device)
                start = time.perf_counter()
                layer(x, k_cache, v_cache, cached)
                _sync(device)
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            samples.append(StepSample(((n, cached),), seconds))
            rows.append({"cached": cached, "chunk": n, "seconds": seconds})
    fit = CostModel.fit(samples)
    model = fit.model
    flops = CostModel.analytic(dataclasses.replace(shape, num_layers=1))
    for row in rows:
        if "seconds" in row:
            predicted = model.chunk_cost(row["chunk"], row["cached"]) + model.step_overhead
            row["predicted_s"] = predicted
            row["tflops"] = flops.chunk_cost(row["chunk"], row["cached"]) / row["seconds"] / 1e12
    return {
        "shape": dataclasses.asdict(shape),
        "attention_kernel": "flash (lower-right causal, GQA)" if flash else "math (CPU)",
        "rows": rows,
        "fit_per_layer": model.to_dict(),
        "fit_rel_rmse": fit.rel_rmse,
        "fit_samples": fit.num_samples,
    }


def project(sizes: Sizes, per_layer: CostModel) -> list[dict]:
    """CPP's plan against fixed chunks in the simulator, the fitted layer cost x layers/stage."""
    rows = []
    for pp in sizes.pp_sizes:
        layers = -(-sizes.layer.num_layers // pp)
        stage = CostModel(
            per_layer.linear * layers,
            per_layer.attention * layers,
            per_layer.step_overhead * layers,
            per_layer.unit,
            per_layer.context * layers,
        )
        for n in sizes.prompt_lengths:
            fixed = simulate(fixed_chunks(n, sizes.fixed_chunk), stage, pp, max_in_flight=pp)
            plan = cpp_plan(stage, n, pp)
            cpp = simulate(plan, stage, pp, max_in_flight=pp)
            rows.append(
                {
                    "pp": pp,
                    "prompt_tokens": n,
                    "fixed_chunk": sizes.fixed_chunk,
                    "fixed_ttft_s": fixed.makespan,
                    "fixed_bubble": fixed.bubble,
                    "cpp_chunks": len(plan),
                    "cpp_first_chunk": plan[0],
                    "cpp_ttft_s": cpp.makespan,
                    "cpp_bubble": cpp.bubble,
                    "cpp_speedup": fixed.makespan / cpp.makespan,
                }
            )
    return rows


# ----------------------------------------------------------------------------- report


def _environment(device: torch.device) -> dict:
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("diffusers", "transformers", "triton"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[dist] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
        }
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def markdown(report: dict) -> str:
    env, dit, prof = report["environment"], report["dit"], report["layer_profile"]
    lines = [f"# GPU check ({'dry run, ' if report['dry_run'] else ''}{report['device']})", ""]
    lines += [", ".join(f"{k} {v}" for k, v in env.items()), ""]
    lines += ["## DiT stage (step-level batching) vs sequential diffusers", ""]
    if "skipped" in dit:
        lines.append(f"skipped: {dit['skipped']}")
    else:
        lines += [
            f"{dit['transformer_params_billion']}B-parameter transformer, {dit['dtype']}, "
            f"{dit['image_size']}x{dit['image_size']} ({dit['image_tokens']} image tokens), "
            f"{dit['num_requests']} requests x {dit['num_steps']} steps.",
            "",
            "| path | wall s | images/s | step s |",
            "|---|---|---|---|",
            f"| diffusers, one call per request | {dit['diffusers_sequential_s']} | "
            f"{dit['diffusers_images_per_s']} | {dit['single_request_step_s']} (batch 1) |",
            f"| DiT stage, step-level batching | {dit['stage_s']} | {dit['stage_images_per_s']} "
            f"| {dit['batched_step_s_median']} (batch {dit['num_requests']}) |",
            "",
            f"Speed-up {dit['speedup_vs_diffusers']}x; latents vs diffusers: relative L2 at most "
            f"{dit['latent_rel_l2_vs_diffusers_max']:.2e}; finite: {dit['finite']}.",
        ]
    lines += ["", "## Chunk cost of one decoder layer", ""]
    if "skipped" in prof:
        lines.append(f"skipped: {prof['skipped']}")
    else:
        fit = prof["fit_per_layer"]
        lines += [
            f"Attention: {prof['attention_kernel']}. Fit per layer: linear {fit['linear']:.3e} "
            f"s/token, attention {fit['attention']:.3e} s/pair, context {fit['context']:.3e} "
            f"s/cached token, overhead {fit['step_overhead']:.3e} s; relative RMS error "
            f"{prof['fit_rel_rmse']:.1%} over {prof['fit_samples']} points.",
            "",
            "| cached | chunk | measured ms | model ms | TFLOP/s |",
            "|---|---|---|---|---|",
        ]
        for row in prof["rows"]:
            if "seconds" in row:
                lines.append(
                    f"| {row['cached']} | {row['chunk']} | {row['seconds'] * 1e3:.2f} | "
                    f"{row['predicted_s'] * 1e3:.2f} | {row['tflops']:.3g} |"
                )
        lines += ["", "## CPP projection (fitted layer cost, layers only)", ""]
        lines += [
            "| p | prompt | fixed chunks: TTFT s (bubble) | CPP: TTFT s (bubble, chunks) "
            "| CPP speed-up |",
            "|---|---|---|---|---|",
        ]
        for r in report["projection"]:
            lines.append(
                f"| {r['pp']} | {r['prompt_tokens'] // K}K | {r['fixed_ttft_s']:.2f} "
                f"({r['fixed_bubble']:.1%}) | {r['cpp_ttft_s']:.2f} ({r['cpp_bubble']:.1%}, "
                f"{r['cpp_chunks']}) | {r['cpp_speedup']:.3f}x |"
            )
    lines += ["", f"Elapsed: {report['elapsed_s']:.0f} s.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes (for CI)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--md", type=Path, help="write a markdown summary here")
    parser.add_argument("--budget-s", type=float, default=330.0, help="skip what would not fit")
    parser.add_argument("--dit-layers", type=int, help="transformer blocks (default: 60)")
    args = parser.parse_args(argv)

    clock = Clock(args.budget_s)
    if args.dry_run:
        sizes, device, dtype = DRY, torch.device("cpu"), torch.float32
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --dry-run on a CPU")
        sizes, device, dtype = FULL, torch.device("cuda"), torch.bfloat16
    if args.dit_layers is not None:
        sizes = dataclasses.replace(sizes, dit=sizes.dit | {"num_layers": args.dit_layers})

    report: dict[str, Any] = {
        "dry_run": args.dry_run,
        "device": str(device),
        "environment": _environment(device),
    }
    report["dit"] = check_dit(sizes, device, dtype, clock)
    print(f"[gpu_check] DiT stage done at {clock.elapsed():.0f} s", flush=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    report["layer_profile"] = profile_layer(sizes, device, dtype, clock)
    print(f"[gpu_check] layer profile done at {clock.elapsed():.0f} s", flush=True)
    if "fit_per_layer" in report["layer_profile"]:
        per_layer = CostModel.from_dict(report["layer_profile"]["fit_per_layer"])
        report["projection"] = project(sizes, per_layer)
    report["elapsed_s"] = clock.elapsed()

    text = markdown(report)
    print(text)
    write_result(args.json, report, dtype=str(dtype).removeprefix("torch."))
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
