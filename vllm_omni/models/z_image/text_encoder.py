# SPDX-License-Identifier: Apache-2.0
"""Z-Image's text encoder as a vLLM model: Qwen3 up to the output of its second-to-last layer.

`ZImagePipeline` encodes a prompt with `hidden_states[-2]` of its Qwen3: the residual stream
out of the decoder's second-to-last layer, before any norm. vLLM's Qwen3 ends every forward with
the final RMS norm, which cannot be undone, so this class is Qwen3 with one decoder layer fewer
(`encoder_config.encoder_hf_overrides`) and the final norm replaced by the residual sum the
layers leave behind. Registered with vLLM's ModelRegistry by the plugin
(`vllm_omni.plugin.register`) under `encoder_config.ENCODER_ARCH`; run as a pooling model, its
rows are what the pipeline hands its transformer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class ResidualSum(nn.Module):
    """In place of the final norm: a decoder layer's output as transformers reports it (vLLM's
    layers hand on their output and the residual apart)."""

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None):
        return (hidden if residual is None else hidden + residual), None


class ZImageQwen3TextEncoder(Qwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.model.norm = ResidualSum()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        layers = self.config.num_hidden_layers

        def kept(name: str) -> bool:
            if name.startswith("model.norm."):
                return False  # replaced by the residual sum
            match = _LAYER.match(name)
            return match is None or int(match.group(1)) < layers  # not the dropped layer

        return super().load_weights((name, t) for name, t in weights if kept(name))
