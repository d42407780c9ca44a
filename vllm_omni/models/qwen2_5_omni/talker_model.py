# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-Omni's talker as a vLLM model: thinker states in, speech-codec tokens out.

Registered with vLLM's ModelRegistry by the plugin (`vllm_omni.plugin.register`) under
`TALKER_ARCH`. The stage engine loads it from the full Qwen2.5-Omni folder: `talker_hf_overrides`
hands vLLM the talker's sub-config, and `load_weights` keeps only the `talker.*` tensors.

Per position, transformers feeds the talker `thinker_to_talker_proj(codec_embedding(code) + c)`,
where `c` comes from the thinker (its hidden state plus token embedding, a speaker or text-end
embedding; see `vllm_omni.models.qwen2_5_omni.talker`), and only `c` for the thinker's prompt
positions.
That conditioning is per request and per position, which vLLM's inputs cannot express, so the
talker worker (`vllm_omni.models.qwen2_5_omni.talker_worker`) sets it on the model before each
forward:
`set_conditioning(rows, codec_scale)`, one row per scheduled token.

The decoder is vLLM's Llama stack configured as Qwen2 (biased q/k/v, unbiased o) with the
talker's explicit head_dim (the real checkpoint has hidden 896 with 128-wide heads, which
vLLM's Qwen2 attention, deriving head_dim from hidden / heads, cannot load).

Positions: transformers gives the talker 3-D M-RoPE positions, the thinker prompt's own rope index
(image and video tokens get temporal/height/width positions; text and audio tokens the same value
on all three), then one per token after it. The talker worker hands the forward those [3, tokens]
positions (`vllm_omni.models.talker_common.talker_positions`) and the decoder
layers rotate with M-RoPE.
vLLM itself is told nothing of M-RoPE (`mrope_section` moves out of `rope_parameters`): its runner
would otherwise compute the positions from the request's own multimodal inputs, and a talker
request has none.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

TALKER_ARCH = "Qwen2_5OmniTalkerForCodec"


def talker_hf_overrides(hf_config):
    """vLLM `hf_overrides`: the talker's config out of the full Qwen2.5-Omni config. (vLLM also
    calls it on a placeholder config to see whether it changes the model type: left alone.)"""
    if not hasattr(hf_config, "talker_config"):
        return hf_config
    talker = copy.deepcopy(hf_config.talker_config)
    talker.architectures = [TALKER_ARCH]
    talker.qkv_bias = True  # Qwen2 attention in vLLM's Llama layers
    talker.attention_bias = False
    rope = dict(talker.rope_parameters or {})
    # The layers rotate with M-RoPE, vLLM's runner stays 1-D (see the module docstring).
    talker.omni_mrope_section = rope.pop("mrope_section", None)
    talker.rope_parameters = rope
    return talker


class Qwen25OmniTalkerForCodec(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        from vllm.model_executor.layers.linear import ReplicatedLinear
        from vllm.model_executor.layers.logits_processor import LogitsProcessor
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            VocabParallelEmbedding,
        )
        from vllm.model_executor.models.llama import LlamaModel

        config = vllm_config.model_config.hf_config
        self.config = config
        self.codec_embedding = VocabParallelEmbedding(config.vocab_size, config.embedding_size)
        self.thinker_to_talker_proj = ReplicatedLinear(
            config.embedding_size, config.hidden_size, bias=True
        )
        # Its own embed_tokens (vocab x hidden) stays unused: inputs arrive as embeddings.
        self.model = LlamaModel(vllm_config=vllm_config, prefix=f"{prefix}model")
        self.uses_mrope = bool(getattr(config, "omni_mrope_section", None))
        if self.uses_mrope:
            _rotate_with_mrope(self.model, config)
        self.codec_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        self._conditioning: tuple[torch.Tensor, torch.Tensor] | None = None

    def set_conditioning(self, rows: torch.Tensor | None, codec_scale: torch.Tensor | None) -> None:
        """`rows` [tokens, embedding_size] added to each token's input; `codec_scale` [tokens, 1]
        is 0 where the codec embedding of the token is left out (the thinker's prompt)."""
        self._conditioning = None if rows is None else (rows, codec_scale)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.codec_embedding(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        embeds = self.codec_embedding(input_ids) if inputs_embeds is None else inputs_embeds
        if self._conditioning is not None:
            rows, scale = self._conditioning
            n = min(rows.shape[0], embeds.shape[0])
            # Padding rows (compiled or graph batch sizes) keep the codec embedding alone.
            embeds = torch.cat([embeds[:n] * scale[:n] + rows[:n], embeds[n:]])
        hidden, _ = self.thinker_to_talker_proj(embeds)
        return self.model(None, positions, intermediate_tensors, inputs_embeds=hidden)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.codec_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        params = dict(self.named_parameters())
        loaded: set[str] = set()
        decoder: list[tuple[str, torch.Tensor]] = []
        for name, tensor in weights:
            if name in CHECKPOINT_NAMES:
                local = CHECKPOINT_NAMES[name]
                param = params[local]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                loaded.add(local)
            elif name.startswith("talker.model."):
                decoder.append((name.removeprefix("talker.model."), tensor))
            # thinker.* and token2wav.* belong to the other stages
        loaded |= {f"model.{n}" for n in self.model.load_weights(decoder)}
        # vLLM checks that every parameter was loaded; the decoder's own embedding is unused.
        loaded.add("model.embed_tokens.weight")
        return loaded


def _rotate_with_mrope(model: nn.Module, config) -> None:
    """Each decoder layer's rotary embedding as vLLM's M-RoPE (it takes [tokens] or [3, tokens]
    positions); the rest of the layer is untouched."""
    from vllm.model_executor.layers.rotary_embedding import get_rope

    rope = {**config.rope_parameters, "mrope_section": list(config.omni_mrope_section)}
    for layer in model.layers:
        attention = getattr(layer, "self_attn", None)  # absent on other pipeline ranks
        if attention is not None:
            attention.rotary_emb = get_rope(
                attention.head_dim,
                max_position=attention.max_position_embeddings,
                rope_parameters=rope,
                is_neox_style=True,
            )


# Checkpoint tensors of the talker outside its decoder stack -> this module's parameters.
CHECKPOINT_NAMES = {
    "talker.model.embed_tokens.weight": "codec_embedding.weight",
    "talker.codec_head.weight": "codec_head.weight",
    "talker.thinker_to_talker_proj.weight": "thinker_to_talker_proj.weight",
    "talker.thinker_to_talker_proj.bias": "thinker_to_talker_proj.bias",
}
