# SPDX-License-Identifier: Apache-2.0
"""Greedy tokens of plain vLLM at PP=1 on the tiny 8-layer Llama: the reference every CPP
configuration must reproduce (tests/cpp/test_cpp_engine.py, tests/executor/test_cpu_ray.py).
Float32 and eager, so that only the chunking differs (CPP cuts prompts at other places than
vLLM's fixed chunks). Computed once per session (`greedy_reference` in tests/conftest.py), in the
same engine as the text prompts that tests/models/test_tiny.py compares with transformers: every
vLLM engine start costs 30-50 s on two cores.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable
from typing import Any

MAX_TOKENS = 8
COMMON = dict(dtype="float32", enforce_eager=True, seed=0)
# Up to 8K: CPP's chunks already shrink with the context there (the PP=4 test checks the cut),
# and 16K in float32 cost four times as long at PP=1 (attention grows with the square of the
# length) for the same check.
LONG_LENGTHS = [1024, 4096 + 37, 8192 + 11]
MAX_MODEL_LEN = 8192 + 64
REFERENCE_MAX_MODEL_LEN = 65536
"""The reference engine's: llama-8l serves 64K-token contexts in the benchmarks, and
tests/models/test_tiny.py checks through it that vLLM accepts that."""

# Text prompts that vLLM must continue exactly as transformers does (tests/models/test_tiny.py).
TEXT_PROMPTS = [
    "The quick brown fox",
    "Hello, my name is",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "1 2 3 4 5",
]
TEXT_NEW_TOKENS = 16


def _random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 2000) for _ in range(n)]


def make_prompts() -> dict[str, list[list[int]]]:
    rng = random.Random(1)
    shared = _random_ids(rng, 3000)  # two prompts sharing a prefix: prefix-cache hits
    return {
        "long": [_random_ids(rng, n) for n in LONG_LENGTHS],
        "prefix": [shared + _random_ids(rng, 500), shared + _random_ids(rng, 900)],
        "preempt": [_random_ids(rng, n) for n in (3000, 2800, 2600, 2400)],
    }


def generate(llm, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def text_greedy(llm) -> dict[str, Any]:
    """TEXT_PROMPTS' greedy continuations and how vLLM renders a one-message chat."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=TEXT_NEW_TOKENS, min_tokens=TEXT_NEW_TOKENS)
    outputs = llm.generate(TEXT_PROMPTS, params, use_tqdm=False)
    chat = llm.chat(
        [{"role": "user", "content": "hi"}],
        SamplingParams(temperature=0, max_tokens=1),
        use_tqdm=False,
    )
    return {
        "text": [list(o.outputs[0].token_ids) for o in outputs],
        "chat_prompt": chat[0].prompt,
    }


def run_engine(
    model,
    prompt_sets: dict[str, list[list[int]]],
    inspect: Callable[[Any], dict[str, Any]] | None = None,
    **engine_args,
) -> dict[str, Any]:
    """Greedy tokens per prompt set, vLLM's preemption count, CPP's step records (with CPP's
    worker) and whatever `inspect(llm)` returns while the engine is still up."""
    from vllm import LLM

    llm = LLM(model=str(model), **COMMON, disable_log_stats=False, **engine_args)
    try:
        outputs: dict[str, Any] = {name: generate(llm, p) for name, p in prompt_sets.items()}
        outputs["num_preemptions"] = sum(
            m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"
        )
        if engine_args.get("worker_cls"):  # CPP's worker keeps a step timeline
            outputs["step_records"] = llm.collective_rpc("cpp_take_step_records")
        if inspect is not None:
            outputs.update(inspect(llm))
        return outputs
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
