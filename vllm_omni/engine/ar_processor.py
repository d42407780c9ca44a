# SPDX-License-Identifier: Apache-2.0
"""Stage processors: what an AR stage feeds its vLLM engine and what it passes downstream.

Model families register them by name (a stage's `processor:`, vllm_omni.registry). Two
kinds:

- `PromptEncoder`: the engine runs a text encoder as a pooling model; the processor wraps the
  prompts in the model's template and keeps the rows the next stage reads. An encoder that also
  reads the request's input images (a vision-language model) overrides `images`.
- a `Generator` subclass: drives a generating engine itself (`run`), e.g. a stage that writes
  text and hands on its hidden states, or one that turns them into speech codes.

Without a processor an AR stage generates text from the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

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

    request_options: ClassVar[tuple[str, ...]] = ()
    """Request-level options (fields of the prompt mapping) it reads from its inputs."""

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

    def images(self, inputs: dict[str, Any]) -> list[Any]:
        """The images every prompt of the request is encoded with (none: text alone). With
        images the engine's multimodal processor expands their placeholders in the prompt."""
        return []

    def output(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states[self.drop_tokens :][: self.max_tokens]


Emit = Callable[[dict[str, Any]], None]


class Generator:
    """A processor that drives a generating vLLM engine for its stage. Subclasses implement
    `run`; the rest has defaults."""

    takes_user_params: ClassVar[bool] = True
    """Whether one SamplingParams given for a whole request reaches this stage."""
    takes_messages: ClassVar[bool] = False
    """Whether, as a first stage, it renders chat messages (`messages` in the prompt)."""
    hands_on_hidden_states: ClassVar[bool] = False
    """Whether its engine's worker returns each token's hidden states (`stage.hidden_states`)."""
    request_options: ClassVar[tuple[str, ...]] = ()
    """Request-level options (fields of the prompt mapping) it reads from its inputs."""

    def engine_defaults(self) -> dict[str, Any]:
        """vLLM engine arguments the processor needs (a stage's `engine_args` override them)."""
        return {}

    def default_params(self) -> Any:
        """The stage's parameters when a request gives none (None: vLLM's SamplingParams())."""
        return None

    def check_options(self, inputs: Mapping[str, Any]) -> None:
        """Raise ValueError naming the field for a request option it cannot serve."""

    async def run(
        self, stage: Any, request_id: str, inputs: dict[str, Any], params: Any, emit: Emit | None
    ) -> dict[str, Any]:
        raise NotImplementedError


StageProcessor = PromptEncoder | Generator
"""What a stage's `processor:` names (vllm_omni.registry.processors())."""
