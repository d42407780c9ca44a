# SPDX-License-Identifier: Apache-2.0
"""Fit the CPP cost model to step latencies measured on this machine, and cache it.

    python -m vllm_omni.cpp.calibrate MODEL -pp 2      # about a minute for a tiny model on CPU

Runs a short profile through a real CPP engine (worker step timeline, prefix caching off): prompts
of up to --max-context tokens (default 32K) prefilled in different numbers of steps (the
per-request `cpp_num_steps`), so chunks of many sizes run after many context lengths, plus short
prompts. Every rank times every step; a step's latency is its slowest rank's busy time, the
pipeline's bottleneck. The fit (`CostModel.fit`) is written where the CPP scheduler looks for it
(`cost_model_source.calibration_path_for`), so later engines for the same model, pipeline size,
dtype and device use it without any flag.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from vllm_omni.cpp.cost_model import CostModel, FitResult, StepSample
from vllm_omni.cpp.scheduler import NUM_STEPS_ARG

DEFAULT_MAX_CONTEXT = 32768


def profile_prompts(max_context: int) -> list[tuple[int, int]]:
    """(prompt length, steps to prefill it in): chunks of ~40 to ~4K tokens after contexts up to
    `max_context`. The per-chunk cost of a pass over the context grows faster than linearly once
    the KV cache outgrows the CPU caches, so calibrate over the contexts you will serve."""
    top, mid, low = max_context, max_context // 2, max(max_context // 8, 1024)
    return [
        (top, 8),
        (top, 32),
        (mid, 4),
        (mid, 12),
        (mid, 40),
        (low, 2),
        (low, 20),
        (1024, 1),
        (256, 1),
    ]


WARMUP = ((4096, 2), (64, 1))


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


def profile(llm, prompts: list[tuple[int, int]], seed: int = 0) -> list[StepSample]:
    """Run one prompt at a time through `llm` (a CPP engine) and collect samples."""
    from vllm import SamplingParams

    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(seed)

    def run(length: int, num_steps: int) -> None:
        params = SamplingParams(max_tokens=1, extra_args={NUM_STEPS_ARG: num_steps})
        prompt = {"prompt_token_ids": [rng.randrange(vocab) for _ in range(length)]}
        llm.generate([prompt], params, use_tqdm=False)

    for length, num_steps in WARMUP:
        run(length, num_steps)
    llm.collective_rpc("cpp_take_step_records")
    samples: list[StepSample] = []
    for length, num_steps in prompts:
        run(length, num_steps)
        samples += samples_from_records(llm.collective_rpc("cpp_take_step_records"))
    return samples


def calibrate(
    model: str,
    pipeline_parallel_size: int = 1,
    save: bool = True,
    max_context: int = DEFAULT_MAX_CONTEXT,
    **engine_args: Any,
) -> FitResult:
    """Profile `model` in a fresh engine, fit the cost model, and cache it for CPP."""
    from vllm import LLM

    from vllm_omni.cpp.cost_model_source import calibration_path_for
    from vllm_omni.cpp.engine_args import cpp_engine_args

    prompts = profile_prompts(max_context)
    longest = max(length for length, _ in prompts)
    engine_args = cpp_engine_args(
        # The profile's forced step counts are its own fit's data, not the engine's online fit.
        {"online_calibration": False},
        pipeline_parallel_size=pipeline_parallel_size,
        enable_prefix_caching=False,
        max_model_len=longest + 64,
        **engine_args,
    )
    llm = LLM(model=model, **engine_args)
    result = CostModel.fit(profile(llm, prompts))
    if save:
        path = calibration_path_for(llm.llm_engine.vllm_config)
        path.parent.mkdir(parents=True, exist_ok=True)
        result.model.save(path)
        print(f"[calibrate] saved {path}")
    llm.llm_engine.engine_core.shutdown()
    del llm
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--max-context",
        type=int,
        default=DEFAULT_MAX_CONTEXT,
        help="longest prompt profiled; calibrate over the contexts you serve",
    )
    args = parser.parse_args(argv)
    result = calibrate(
        args.model, args.pipeline_parallel_size, max_context=args.max_context, dtype=args.dtype
    )
    m = result.model
    print(
        f"[calibrate] per step: {m.step_overhead * 1e3:.2f} ms + {m.linear * 1e6:.3f} us/token "
        f"+ {m.attention * 1e9:.3f} ns/(token x context) + {m.context * 1e6:.3f} us/context token "
        f"per chunk; relative RMS error "
        f"{result.rel_rmse:.1%} over {result.num_samples} steps"
    )


if __name__ == "__main__":
    main()
