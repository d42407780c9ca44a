# SPDX-License-Identifier: Apache-2.0
"""transformers' greedy decode as the reference for vLLM's tokens, with its near-tie margin."""

from __future__ import annotations

import contextlib

import torch

MIN_LOGIT_GAP = 1e-3
"""Smallest top-1/top-2 logit gap for a reference to be trusted: below it a different (correct)
kernel may flip a greedy token."""


@contextlib.contextmanager
def one_thread():
    """Run torch on one thread. These models are too small to gain from two, and on this 2-core
    machine two OpenMP threads sometimes made transformers' generate 20-100x slower (seconds
    instead of 0.1 s per prompt) whenever anything else wanted a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def greedy_with_gap(
    model, prompts: list[list[int]], new_tokens: int
) -> tuple[list[list[int]], float]:
    """Exactly `new_tokens` greedy tokens per prompt (EOS masked, as vLLM's min_tokens does),
    and the smallest top-1/top-2 logit gap over every step."""
    tokens, min_gap = [], float("inf")
    for prompt in prompts:
        with torch.no_grad(), one_thread():
            out = model.eval().generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                output_scores=True,
                return_dict_in_generate=True,
            )
        for scores in out.scores:
            top2 = scores[0].topk(2).values
            min_gap = min(min_gap, (top2[0] - top2[1]).item())
        tokens.append(out.sequences[0, len(prompt) :].tolist())
    return tokens, min_gap


def text_greedy_with_gap(
    path, prompts: list[str], new_tokens: int
) -> tuple[list[list[int]], float]:
    """`greedy_with_gap` on text prompts, for the model and tokenizer in folder `path`, float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return greedy_with_gap(model, [tok(p).input_ids for p in prompts], new_tokens)
