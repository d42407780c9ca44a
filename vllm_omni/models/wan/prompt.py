# SPDX-License-Identifier: Apache-2.0
"""Wan's prompt embeddings, as the pipelines' `_get_t5_prompt_embeds` makes them, for many
prompts in one UMT5 call.

The pipelines clean each prompt (ftfy, whitespace), tokenize it padded to 512 tokens, run the
encoder over all 512 and keep the real tokens' states, zero-padding the rest. The encoder
attends only to real tokens and its position biases depend only on the distance between two
tokens, so the real tokens' states are the same when the trailing padding is left out: the
encoder runs here over the longest prompt's tokens only (a few dozen instead of 512), and the
result is zero-padded to 512 as the pipeline's is. `pinned()` fails tests/test_patches.py when
diffusers changes the function this stands in for.
"""

from __future__ import annotations

import torch

MAX_SEQUENCE_LENGTH = 512  # the pipelines' default: the DiT sees every prompt at this length


@torch.inference_mode()
def encode_prompts(pipe, texts: list[str], device: torch.device) -> torch.Tensor:
    """[len(texts), 512, hidden] prompt embeddings in the text encoder's dtype."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    tokens = pipe.tokenizer(
        [prompt_clean(text) for text in texts],
        padding="max_length",
        max_length=MAX_SEQUENCE_LENGTH,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    lengths = tokens.attention_mask.sum(dim=1).tolist()
    longest = max(lengths)
    hidden = pipe.text_encoder(
        tokens.input_ids[:, :longest].to(device), tokens.attention_mask[:, :longest].to(device)
    ).last_hidden_state
    embeds = hidden.new_zeros(len(texts), MAX_SEQUENCE_LENGTH, hidden.shape[-1])
    for row, length in enumerate(lengths):
        embeds[row, :length] = hidden[row, :length]
    return embeds


def pinned() -> list:
    from diffusers import WanImageToVideoPipeline, WanPipeline

    from vllm_omni._patches import Pinned

    why = (
        "prompt.encode_prompts makes the same embeddings (cleaned, tokenized to 512, the real "
        "tokens' last hidden states, zero-padded) without encoding the padding."
    )
    return [
        Pinned(WanPipeline, "_get_t5_prompt_embeds", "6309d34f887f", why),
        Pinned(WanImageToVideoPipeline, "_get_t5_prompt_embeds", "e0d07ec1a69a", why),
    ]
