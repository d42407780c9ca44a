# SPDX-License-Identifier: Apache-2.0
"""Z-Image's text encoder stage (processor `z_image_prompt`): the prompt in Qwen3's chat
template as `ZImagePipeline` renders it (one user turn, the assistant's turn opened), at most 512
tokens, every row kept; the engine runs `ZImageQwen3TextEncoder` (text_encoder.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_omni.engine.ar_processor import PromptEncoder

TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default `max_sequence_length`


@dataclass(frozen=True)
class ZImagePromptEncoder(PromptEncoder):
    def engine_defaults(self) -> dict[str, Any]:
        from vllm_omni.models.z_image.encoder_config import encoder_hf_overrides

        return {**super().engine_defaults(), "hf_overrides": encoder_hf_overrides}


def prompt_encoder(config=None) -> ZImagePromptEncoder:
    return ZImagePromptEncoder(TEMPLATE, drop_tokens=0, max_tokens=MAX_SEQUENCE_LENGTH)
