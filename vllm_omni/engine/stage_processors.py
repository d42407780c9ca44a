# SPDX-License-Identifier: Apache-2.0
"""Stage processors: what an AR stage feeds its vLLM engine and what it passes downstream.

Registered by name (`processor: qwen_image_prompt` in a stage config). A processor turns the
request's inputs into vLLM prompts, names the engine settings it needs (e.g. a pooling runner
or a worker class), and turns vLLM's per-request output into the stage's named outputs. The
prompt encoder lives here; Qwen2.5-Omni's thinker and talker in `qwen25_omni`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PromptEncoder:
    """Run a text encoder as a vLLM pooling model and keep its last hidden states.

    `template` wraps each prompt; the first `drop_tokens` rows (the template's prefix) are
    dropped and at most `max_tokens` rows kept - exactly what the diffusers pipeline does
    with the same encoder, so the embeddings (and the images) match.
    """

    template: str
    drop_tokens: int
    max_tokens: int
    # Prompt fields of a request this processor encodes, and the tensor each becomes.
    fields: tuple[tuple[str, str], ...] = (
        ("prompt", "prompt_embeds"),
        ("negative_prompt", "negative_prompt_embeds"),
    )

    @property
    def max_input_tokens(self) -> int:
        """The tokens that decide the rows kept: the encoder is causal, so a row depends only on
        the tokens up to it, and longer prompts are cut here (diffusers cuts them later)."""
        return self.drop_tokens + self.max_tokens

    def engine_defaults(self) -> dict[str, Any]:
        from vllm.config import PoolerConfig

        return {
            "runner": "pooling",
            "pooler_config": PoolerConfig(task="token_embed", use_activation=False),
            "limit_mm_per_prompt": {"image": 0, "video": 0},
            # Not the model's context (128K for Qwen2.5-VL): it would size the KV cache.
            "max_model_len": self.max_input_tokens,
        }

    def prompts(self, inputs: dict[str, Any]) -> dict[str, str]:
        """Output tensor name -> the text to encode for it."""
        out = {}
        for field_name, tensor_name in self.fields:
            text = inputs.get(field_name)
            if text is not None:
                out[tensor_name] = self.template.format(text)
        return out

    def output(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states[self.drop_tokens :][: self.max_tokens]


# Qwen-Image's prompt format (the model's, as its pipeline applies it).
QWEN_IMAGE_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)


def _processors() -> dict[str, Any]:
    from vllm_omni.engine.qwen25_omni import TalkerGenerator, ThinkerGenerator

    return {
        "qwen_image_prompt": PromptEncoder(QWEN_IMAGE_TEMPLATE, drop_tokens=34, max_tokens=512),
        # Generating stages: `for_stage(config)` binds them to their stage; `run` drives the engine.
        "qwen25_omni_thinker": ThinkerGenerator(),
        "qwen25_omni_talker": TalkerGenerator(),
    }


PROCESSORS = _processors()
