# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's text encoder stage (processor `qwen_image_prompt`): Qwen2.5-VL run as a pooling
model on vLLM, its prompt wrapped as the pipeline wraps it."""

from __future__ import annotations

from vllm_omni.engine.ar_processor import PromptEncoder

TEXT_ENCODER = ("text_encoder", "tokenizer")
"""The pipeline's components this stage runs (the DiT and VAE stages do not load them)."""

# The model's prompt format, as its pipeline applies it. The pipeline drops the template's
# first 34 tokens' rows and keeps at most 512 after them.
TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)


def prompt_encoder(config=None) -> PromptEncoder:
    return PromptEncoder(TEMPLATE, drop_tokens=34, max_tokens=512)
