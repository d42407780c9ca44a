# SPDX-License-Identifier: Apache-2.0
"""Fit the CPP cost model to step latencies measured on this machine, and cache it.

    python -m vllm_omni.cpp.calibrate MODEL -pp 2      # about a minute for a tiny model on CPU

Runs a short profile through a real engine (CPP worker timeline, plain fixed-size chunks, prefix
caching off): prompts whose chunks cover a range of chunk sizes and context lengths. Every rank
times every step; a step's latency is its slowest rank's busy time, the pipeline's bottleneck.
The fit (`CostModel.fit`) is written where the CPP scheduler looks for it
(`cost_model_source.calibration_path_for`), so later engines for the same model, pipeline size,
dtype and device use it without any flag.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from vllm_omni.cpp.cost_model import CostModel, FitResult, StepSample

PROFILE_CHUNK = 2048
# Prompt lengths: full PROFILE_CHUNK chunks at growing context, plus remainders of other sizes.
PROFILE_LENGTHS = (16384 + 96, 8192 + 640, 4096 + 1280, 3072, 1536 + 32, 768, 256)
WARMUP_LENGTHS = (PROFILE_CHUNK + 16, 64)


def samples_from_records(records_per_rank: list[list[dict[str, Any]]]) -> list[StepSample]:
    """One sample per step: the chunks it ran and the slowest rank's busy seconds."""
    counts = {len(records) for records in records_per_rank}
    if len(counts) != 1:
        raise RuntimeError(f"ranks recorded different numbers of steps: {sorted(counts)}")
    samples = []
    for step in zip(*records_per_rank):
        chunks = {tuple(map(tuple, r["chunks"])) for r in step}
        if len(chunks) != 1:
            raise RuntimeError("ranks disagree on a step's chunks")
        seconds = max(r["end_s"] - r["start_s"] for r in step)
        samples.append(StepSample(chunks=chunks.pop(), seconds=seconds))
    return samples


def profile(llm, lengths=PROFILE_LENGTHS, seed: int = 0) -> list[StepSample]:
    """Run one prompt at a time through `llm` (built with the CPP worker) and collect samples."""
    from vllm import SamplingParams

    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for n in WARMUP_LENGTHS:
        llm.generate(
            [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(n)]}], params, use_tqdm=False
        )
    llm.collective_rpc("cpp_take_step_records")
    samples: list[StepSample] = []
    for n in lengths:
        llm.generate(
            [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(n)]}], params, use_tqdm=False
        )
        samples += samples_from_records(llm.collective_rpc("cpp_take_step_records"))
    return samples


def calibrate(
    model: str, pipeline_parallel_size: int = 1, save: bool = True, **engine_args: Any
) -> FitResult:
    """Profile `model` in a fresh engine, fit the cost model, and cache it for CPP."""
    from vllm import LLM

    from vllm_omni.cpp.cost_model_source import calibration_path_for
    from vllm_omni.cpp.worker import worker_cls_for_platform

    llm = LLM(
        model=model,
        pipeline_parallel_size=pipeline_parallel_size,
        max_num_batched_tokens=PROFILE_CHUNK,
        enable_prefix_caching=False,
        worker_cls=worker_cls_for_platform(),
        max_model_len=max(PROFILE_LENGTHS) + 64,
        **engine_args,
    )
    result = CostModel.fit(profile(llm))
    if save:
        path = calibration_path_for(llm.llm_engine.vllm_config)
        path.parent.mkdir(parents=True, exist_ok=True)
        result.model.save(path)
        print(f"[calibrate] saved {path}")
    del llm
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    result = calibrate(args.model, args.pipeline_parallel_size, dtype=args.dtype)
    m = result.model
    print(
        f"[calibrate] per step: {m.step_overhead * 1e3:.2f} ms + {m.linear * 1e6:.3f} us/token "
        f"+ {m.attention * 1e9:.3f} ns/(token x context); relative RMS error "
        f"{result.rel_rmse:.1%} over {result.num_samples} steps"
    )


if __name__ == "__main__":
    main()
