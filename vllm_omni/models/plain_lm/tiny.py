# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight plain language models (the `plain_lm` family), deterministic:

- `llama-8l`: `LlamaForCausalLM`, 8 layers, GQA, 64K context (long-context pipeline parallelism).
- `qwen2-2l`: `Qwen2ForCausalLM`, 2 layers (fast engine tests).

`build_lm(TinyLMConfig(...), out)` builds a Llama or Qwen2 of any other shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vllm_omni.testing import tiny_tokenizer as tt
from vllm_omni.testing.tiny_common import LOGIT_GAIN, chat_generation_config, randomize_


@dataclass(frozen=True)
class TinyLMConfig:
    """Shape of a tiny decoder-only LM. `head_dim` is 64 because vLLM's CPU attention supports
    only some head sizes (32, 64, 80, ...), and 16 is not one of them."""

    architecture: str  # "llama" or "qwen2"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    seed: int
    head_dim: int = 64

    def __post_init__(self) -> None:
        if self.architecture not in ("llama", "qwen2"):
            raise ValueError(f"architecture must be 'llama' or 'qwen2', got {self.architecture!r}")
        if self.num_heads * self.head_dim != self.hidden_size:
            raise ValueError(
                f"num_heads * head_dim must equal hidden_size, got {self.num_heads} * "
                f"{self.head_dim} != {self.hidden_size}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )


LLAMA_8L = TinyLMConfig(
    architecture="llama", num_layers=8, hidden_size=256, num_heads=4, num_kv_heads=2,
    intermediate_size=512, max_position_embeddings=65536, rope_theta=1_000_000.0, seed=1001,
)  # fmt: skip
QWEN2_2L = TinyLMConfig(
    architecture="qwen2", num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1,
    intermediate_size=256, max_position_embeddings=8192, rope_theta=1_000_000.0, seed=1002,
)  # fmt: skip


def build_lm(cfg: TinyLMConfig, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tt.save_tokenizer(out)
    endoftext, im_end = tt.token_id(tt.ENDOFTEXT), tt.token_id(tt.IM_END)
    common = dict(
        vocab_size=tt.VOCAB_SIZE,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        dtype="bfloat16",
    )
    if cfg.architecture == "llama":
        config, cls = LlamaConfig(head_dim=cfg.head_dim, **common), LlamaForCausalLM
    else:
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    torch.manual_seed(cfg.seed)
    model = cls(config)
    randomize_(model, cfg.seed, {"lm_head.weight": LOGIT_GAIN})
    model.generation_config = chat_generation_config()
    model.to(torch.bfloat16).save_pretrained(out)


def build_llama_8l(out: Path) -> None:
    build_lm(LLAMA_8L, out)


def build_qwen2_2l(out: Path) -> None:
    build_lm(QWEN2_2L, out)
