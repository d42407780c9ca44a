# SPDX-License-Identifier: Apache-2.0
"""`make demo` / `python -m vllm_omni.demo`: the main job end to end on the embedded tiny models.

Builds the tiny models (once), then
1. generates chat replies through vLLM with pipeline parallelism (PP=2, one CPU core per stage
   here) and checks them against PP=1 - the same greedy tokens;
2. generates images with OmniLLM on the tiny Qwen-Image pipeline (text encoder on a vLLM engine,
   DiT in its own process), saves them as PNG and checks one against diffusers' own pipeline.
The models have random weights, so replies are gibberish and images are noise-like patterns;
equality with the references is what matters.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

PROMPTS = [
    "What does pipeline parallelism do?",
    "Write one sentence about a diffusion transformer.",
    "Count from one to five.",
]


def run_chat(model: str, pipeline_parallel_size: int, max_tokens: int) -> tuple[list, float]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, pipeline_parallel_size=pipeline_parallel_size, max_model_len=4096)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    start = time.perf_counter()
    outputs = llm.chat(conversations, params)
    elapsed = time.perf_counter() - start
    del llm
    return outputs, elapsed


IMAGE_PROMPTS = ["a red cat on a blue sofa", "a lighthouse at dusk", "two green apples", "rain"]


def run_images(model: str, out_dir: Path) -> bool:
    import numpy as np
    import torch
    from diffusers import QwenImagePipeline

    from vllm_omni import DiffusionSamplingParams, OmniLLM

    params = DiffusionSamplingParams(height=128, width=128, num_inference_steps=20, seed=0)
    with OmniLLM(model) as omni:
        start = time.perf_counter()
        outputs = omni.generate(IMAGE_PROMPTS, params)
        elapsed = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"\n[demo] OmniLLM: {len(outputs)} images in {elapsed:.2f} s")
    for i, out in enumerate(outputs):
        path = out_dir / f"image-{i}.png"
        out.images[0].save(path)
        timings = ", ".join(f"{k} {t.seconds * 1e3:.0f} ms" for k, t in out.stage_timings.items())
        print(f"  {out.prompt!r} -> {path} (seed {out.seed}; {timings})")
    pipe = QwenImagePipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    reference = pipe(
        IMAGE_PROMPTS[0],
        height=128,
        width=128,
        num_inference_steps=20,
        generator=torch.Generator().manual_seed(0),
    ).images[0]
    diff = np.abs(np.asarray(reference, int) - np.asarray(outputs[0].images[0], int)).max()
    same = diff <= 2
    print(f"[demo] OmniLLM image equals diffusers' (max pixel difference {diff}/255): {same}")
    return same


def main(argv: list[str] | None = None) -> None:
    from vllm_omni.models.tiny import build_tiny_models, default_models_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", default=None, help="where the tiny models live")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="where images go")
    args = parser.parse_args(argv)

    models = build_tiny_models(
        args.models_dir or default_models_dir(), names=["llama-8l", "qwen-image"]
    )
    model = str(models["llama-8l"])
    print(f"[demo] tiny model: {model}")

    pp2, pp2_s = run_chat(model, pipeline_parallel_size=2, max_tokens=args.max_tokens)
    pp1, pp1_s = run_chat(model, pipeline_parallel_size=1, max_tokens=args.max_tokens)
    print("\n[demo] vLLM, pipeline_parallel_size=2:")
    for prompt, out in zip(PROMPTS, pp2):
        print(f"  user: {prompt}\n  assistant: {out.outputs[0].text!r}")
    same = all(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(pp1, pp2))
    num_tokens = sum(len(o.outputs[0].token_ids) for o in pp2)
    print(f"\n[demo] {num_tokens} tokens in {pp2_s:.2f} s at PP=2 ({pp1_s:.2f} s at PP=1)")
    print(f"[demo] PP=2 greedy tokens identical to PP=1: {same}")
    images_same = run_images(str(models["qwen-image"]), args.out)
    if not (same and images_same):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
