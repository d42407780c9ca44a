# SPDX-License-Identifier: Apache-2.0
"""Prefill speed of bfloat16 against float32 on this CPU, as the context grows.

    python -m benchmarks.cpu_dtype --json out/cpu_dtype.json

The tiny 8-layer Llama at PP=1, one engine per dtype, both up at once (prefix caching off,
max_tokens=1). For every prompt length and run, the two engines prefill the same random prompt
one after the other, in alternating order, so drift on this noisy machine hits both alike.
Reports the median TTFT per dtype and the ratio bf16 / fp32 per length. vllm_omni's CPU default
(`vllm_omni.platform.cpu_dtype`) picks float32 for `--dtype auto` where the CPU has no native
bfloat16 (no AVX512_BF16 or AMX); this measures why.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from benchmarks.common import write_result

QUIET_S = 1.5
"""vLLM's shared-memory readers busy-poll for 1 s after each message: let the engine that ran
last go quiet before the other one is timed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="512,2048,8192,16384")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_omni.platform.cpu_dtype import native_low_precision
    from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

    model = str(build_tiny_models(default_models_dir(), ["llama-8l"])["llama-8l"])
    engines = {
        dtype: LLM(
            model,
            dtype=dtype,
            max_model_len=max(lengths) + 16,
            enable_prefix_caching=False,
            seed=0,
        )
        for dtype in ("bfloat16", "float32")
    }
    params = SamplingParams(max_tokens=1, temperature=0.0)
    rng = random.Random(0)
    warm = TokensPrompt(prompt_token_ids=[rng.randrange(10, 2000) for _ in range(256)])
    for llm in engines.values():
        llm.generate([warm], params, use_tqdm=False)

    times: dict[str, dict[int, list[float]]] = {d: {n: [] for n in lengths} for d in engines}
    for n in lengths:
        for run in range(args.runs):
            prompt = TokensPrompt(prompt_token_ids=[rng.randrange(10, 2000) for _ in range(n)])
            order = list(engines) if run % 2 == 0 else list(reversed(engines))
            for dtype in order:
                time.sleep(QUIET_S)
                start = time.perf_counter()
                engines[dtype].generate([prompt], params, use_tqdm=False)
                times[dtype][n].append(time.perf_counter() - start)
        bf16 = statistics.median(times["bfloat16"][n])
        fp32 = statistics.median(times["float32"][n])
        print(
            f"{n:6d} tokens: bf16 {bf16:7.2f} s  fp32 {fp32:7.2f} s  bf16/fp32 {bf16 / fp32:.2f}x",
            flush=True,
        )
    for llm in engines.values():
        llm.llm_engine.engine_core.shutdown()

    native = native_low_precision()
    names = None if native is None else sorted(str(d).removeprefix("torch.") for d in native)
    result = {
        "cpu_native": names,
        "runs": args.runs,
        "median_ttft_s": {
            d: {str(n): statistics.median(v) for n, v in t.items()} for d, t in times.items()
        },
        "bf16_over_fp32": {
            str(n): statistics.median(times["bfloat16"][n]) / statistics.median(times["float32"][n])
            for n in lengths
        },
        "all_ttft_s": {d: {str(n): v for n, v in t.items()} for d, t in times.items()},
    }
    print(f"CPU native 16-bit types: {names if names is not None else 'unknown'}")
    write_result(args.json, result, dtype="bfloat16 vs float32")


if __name__ == "__main__":
    main()
