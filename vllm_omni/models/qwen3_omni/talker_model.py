# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni's talker and code predictor as one vLLM model: thinker rows in, speech-codec
frames out.

Registered with vLLM's ModelRegistry by the plugin under `TALKER_ARCH`. The stage engine loads it
from the full Qwen3-Omni folder: `talker_hf_overrides` hands vLLM the talker's decoder config
(with the rest of the talker's config on it), and `load_weights` keeps the `talker.*` tensors.

The decoder is vLLM's: Qwen3 attention (q/k norms) and Qwen2-MoE's sparse block (routed experts
on vLLM's fused MoE plus a sigmoid-gated shared expert), with the talker's own KV cache and
continuous batching. vLLM samples each frame's first code (the codec head); the code predictor
adds the frame's other `num_code_groups - 1` codes.

transformers runs the code predictor when the frame's first code comes back as the next input,
so this model does too: in the forward whose input token is a frame's first code, the code
predictor (transformers' own module, with its KV cache for the 2 + G - 2 positions of one frame)
runs once for every such token of the batch together, G - 1 small passes, from the talker's
last hidden state before that token. The input embedding of that position is then the sum of
the frame's G code embeddings plus the position's projected thinker row. What each position
needs (its thinker row, whether it adds the codec embedding, a frame's codes already known, the
previous hidden state) the talker worker sets before every forward
(`vllm_omni.models.qwen3_omni.talker_worker`) through `set_step`; the forward leaves the new
frames' codes and each request's last hidden state in `step_results`.

Positions: transformers gives the talker 3-D M-RoPE positions, its `get_rope_index` over the
talker's own tokens (`talker_prompt.talker_positions_table`), equal on all three axes for text
and audio prompts. The layers rotate with the talker's interleaved M-RoPE and take either; the
worker hands the forward [3, tokens] positions where a request has an image or video. vLLM
itself is told nothing of M-RoPE (`talker_hf_overrides` drops it from the config it sees): its
runner would compute positions from the request's multimodal inputs, and a talker request has
none.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

TALKER_ARCH = "Qwen3OmniTalkerForCodec"
CODE_PREDICTOR_TOP_K, CODE_PREDICTOR_TOP_P = 50, 0.8  # transformers' when the talker samples


def talker_hf_overrides(hf_config):
    """vLLM `hf_overrides`: the talker's decoder config out of the full Qwen3-Omni config, the
    talker's own fields on it. (vLLM also calls it on a placeholder config: left alone.)"""
    if not hasattr(hf_config, "talker_config"):
        return hf_config
    talker = hf_config.talker_config
    decoder = copy.deepcopy(talker.text_config)
    decoder.architectures = [TALKER_ARCH]
    decoder.talker = copy.deepcopy(talker)
    rope = dict(decoder.rope_parameters or {})
    for key in ("mrope_section", "interleaved", "mrope_interleaved"):
        rope.pop(key, None)  # 1-D positions (see the module docstring)
    decoder.rope_parameters = rope
    return decoder


@dataclass
class TalkerStep:
    """One forward's per-token inputs beyond the token ids, in the batch's token order."""

    rows: torch.Tensor  # [tokens, thinker hidden]
    hidden: torch.Tensor  # [tokens] bool: `hidden_projection` instead of `text_projection`
    codec: torch.Tensor  # [tokens, 1]: 1 where the codec embedding is added
    # Tokens that are a frame's first code: their index in the batch, the residual codes when
    # already known ([n, G - 1], -1 where to predict), the talker's hidden state before them.
    frame_tokens: torch.Tensor  # [n] long
    known: torch.Tensor  # [n, G - 1] long
    previous: torch.Tensor  # [n, hidden]
    greedy: torch.Tensor  # [n] bool
    generators: list[torch.Generator | None] = field(default_factory=list)


class TalkerDecoderLayer(nn.Module):
    def __init__(self, config, cache_config, quant_config, prefix: str) -> None:
        super().__init__()
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.models.qwen2_moe import Qwen2MoeSparseMoeBlock
        from vllm.model_executor.models.qwen3_moe import Qwen3MoeAttention

        self.self_attn = Qwen3MoeAttention(
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            # The talker's own (interleaved M-RoPE): it takes [3, tokens] or 1-D positions.
            rope_parameters=config.talker.text_config.rope_parameters,
            max_position_embeddings=config.max_position_embeddings,
            head_dim=config.head_dim,
            rms_norm_eps=config.rms_norm_eps,
            cache_config=cache_config,
            quant_config=quant_config,
            prefix=f"{prefix}.self_attn",
        )
        self.mlp = Qwen2MoeSparseMoeBlock(config, quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class TalkerDecoder(nn.Module):
    def __init__(self, vllm_config, prefix: str) -> None:
        super().__init__()
        from vllm.model_executor.layers.layernorm import RMSNorm

        config = vllm_config.model_config.hf_config
        self.layers = nn.ModuleList(
            TalkerDecoderLayer(
                config, vllm_config.cache_config, vllm_config.quant_config, f"{prefix}.layers.{i}"
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        hidden, residual = embeds, None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class ResizeMLP(nn.Module):
    """transformers' talker projections: thinker width -> talker width, two linears."""

    def __init__(self, width: int, inner: int, out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(width, inner)
        self.linear_fc2 = nn.Linear(inner, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(nn.functional.silu(self.linear_fc1(x)))


class Qwen3OmniTalkerForCodec(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as CodePredictor,
        )
        from vllm.model_executor.layers.logits_processor import LogitsProcessor
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        config = vllm_config.model_config.hf_config
        talker = config.talker
        self.config = config
        self.num_code_groups = talker.num_code_groups
        self.model = TalkerDecoder(vllm_config, prefix=f"{prefix}model")
        width, inner = talker.thinker_hidden_size, config.intermediate_size
        self.text_projection = ResizeMLP(width, inner, config.hidden_size)
        self.hidden_projection = ResizeMLP(width, inner, config.hidden_size)
        self.codec_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        predictor_config = copy.deepcopy(talker.code_predictor_config)
        predictor_config._attn_implementation = "sdpa"
        self.code_predictor = CodePredictor(predictor_config).to(vllm_config.model_config.dtype)
        self.step: TalkerStep | None = None
        self.step_results: tuple[torch.Tensor, torch.Tensor] | None = None

    def set_step(self, step: TalkerStep | None) -> None:
        self.step = step

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        embeds = self.model.codec_embedding(input_ids) if inputs_embeds is None else inputs_embeds
        step, frames = self.step, None
        if step is not None:
            n = step.rows.shape[0]  # padding rows (graph batch sizes) keep the codec embedding
            rows = step.rows.to(embeds.dtype)
            text = self.text_projection(rows)
            if bool(step.hidden.any()):  # multimodal tokens of the user's turns
                text[step.hidden] = self.hidden_projection(rows[step.hidden])
            head = embeds[:n] * step.codec.to(embeds.dtype) + text
            if step.frame_tokens.numel():
                frames = self.predict_frames(input_ids[step.frame_tokens], step)
                head[step.frame_tokens] += self.residual_embedding(frames)
            embeds = torch.cat([head, embeds[n:]])
        hidden = self.model(positions, embeds)
        self.step_results = (frames, hidden)
        return hidden

    @torch.no_grad()
    def predict_frames(self, first: torch.Tensor, step: TalkerStep) -> torch.Tensor:
        """[n, G - 1] residual codes of the frames whose first codes are `first`: the known
        ones kept, the others predicted for all frames together, one code group a pass."""
        predictor = self.code_predictor
        if bool((step.known >= 0).all()):
            return step.known
        from transformers import DynamicCache

        cache = DynamicCache(config=predictor.config)
        inputs = torch.stack([step.previous, self.model.codec_embedding(first)], dim=1)
        codes = []
        for group in range(self.num_code_groups - 1):
            out = predictor.model(inputs_embeds=inputs, past_key_values=cache, use_cache=True)
            logits = predictor.lm_head[group](out.last_hidden_state[:, -1]).float()
            code = self._choose(logits, step)
            known = step.known[:, group]
            code = torch.where(known >= 0, known, code)
            codes.append(code)
            inputs = predictor.model.codec_embedding[group](code)[:, None]
        return torch.stack(codes, dim=1)

    def _choose(self, logits: torch.Tensor, step: TalkerStep) -> torch.Tensor:
        choice = logits.argmax(-1)
        for i in (~step.greedy).nonzero().flatten().tolist():
            top = logits[i].topk(CODE_PREDICTOR_TOP_K)
            probs = top.values.softmax(-1)
            keep = probs.cumsum(-1) - probs < CODE_PREDICTOR_TOP_P  # top-p over the top-k
            probs = probs * keep
            generator = step.generators[i] if step.generators else None
            pick = torch.multinomial(probs / probs.sum(), 1, generator=generator)
            choice[i] = top.indices[pick[0]]
        return choice

    def residual_embedding(self, frames: torch.Tensor) -> torch.Tensor:
        tables = self.code_predictor.model.codec_embedding
        return sum(tables[g](frames[:, g]) for g in range(frames.shape[1]))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.codec_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader
        from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper

        params = dict(self.named_parameters())
        loaded: set[str] = set()
        decoder: list[tuple[str, torch.Tensor]] = []
        for name, tensor in weights:
            if not name.startswith("talker."):
                continue  # thinker.* and code2wav.* belong to the other stages
            local = name.removeprefix("talker.")
            if local.startswith("model.layers.") or local == "model.norm.weight":
                decoder.append((local, tensor))
            elif local in params:
                param = params[local]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                loaded.add(local)
        mapper = WeightsMapper(orig_to_new_stacked=STACKED)
        loader = AutoWeightsLoader(self)
        loaded |= loader.load_weights(decoder, mapper=mapper)
        return loaded


STACKED = {
    ".q_proj": (".qkv_proj", "q"),
    ".k_proj": (".qkv_proj", "k"),
    ".v_proj": (".qkv_proj", "v"),
    ".shared_expert.gate_proj": (".shared_expert.gate_up_proj", 0),
    ".shared_expert.up_proj": (".shared_expert.gate_up_proj", 1),
}
"""The decoder's checkpoint tensors that vLLM's layers hold fused."""
