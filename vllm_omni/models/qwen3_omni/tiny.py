# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Qwen3-Omni (MoE thinker, MoE talker + code predictor, code2wav) in the
Hugging Face layout, deterministic.

`build_qwen3_omni(out)` writes a folder that transformers
(`Qwen3OmniMoeForConditionalGeneration.from_pretrained`) and vLLM (its
`Qwen3OmniMoeForConditionalGeneration`, the thinker, which skips the other weights) load, with a
`Qwen3OmniMoeProcessor` whose tokenizer has Qwen3-Omni's special tokens and encodes the role
names `system`, `user` and `assistant` as single tokens (the model looks turns up by those ids).
Shapes follow the rules the real model's code imposes, shrunk:

- thinker: a 3-layer MoE LM (4 experts, 2 per token), hidden 128, head_dim 64 (vLLM's CPU
  attention supports 64), interleaved M-RoPE sections summing to head_dim / 2; audio and vision
  towers of one or two layers whose outputs have the LM's width. The talker reads layer 2's
  output: past the layers that DeepStack feeds (1 here, 3 of 48 in the real model), as the real
  model's 24.
- talker: a 2-layer MoE decoder (4 experts, 2 per token, a gated shared expert), hidden 64,
  head_dim 64; its vocabulary is the codebook (64 codes) plus 1024 ids for the codec's special
  tokens (transformers suppresses exactly the last 1024 ids but the end token); 4 code groups,
  so a 1-layer code predictor adds 3 codes per frame.
- code2wav: 2 transformer layers, decoder width 64, the real upsampling (8*5*4*3 * 2*2 = 1920
  samples, 80 ms at 24 kHz, per frame).
- three voices, as the real config names them: chelsie, ethan, aiden.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.testing import tiny_tokenizer as tt
from vllm_omni.testing.tiny_common import LOGIT_GAIN, chat_generation_config, randomize_

QWEN3_OMNI_SEED = 1030
THINKER_HIDDEN = 128
ACCEPT_LAYER = 2
CODEBOOK = 64
CODE_GROUPS = 4
# The codec's special ids sit above the codebook at the real model's offsets from it.
CODEC_PAD, CODEC_BOS, CODEC_EOS = CODEBOOK + 100, CODEBOOK + 101, CODEBOOK + 102
CODEC_NOTHINK, CODEC_THINK_BOS, CODEC_THINK_EOS = CODEBOOK + 107, CODEBOOK + 108, CODEBOOK + 109
SPEAKERS = {"chelsie": CODEBOOK + 253, "ethan": CODEBOOK + 254, "aiden": CODEBOOK + 255}
# head_dim / 2 = 32 rotary frequencies split (time, height, width) as the real 24:20:20.
MROPE = {
    "rope_type": "default",
    "rope_theta": 1_000_000.0,
    "mrope_section": [12, 10, 10],
    "interleaved": True,
    "mrope_interleaved": True,
}

NAMED_TOKENS = {
    "audio_token": "<|audio_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "image_token": tt.IMAGE_PAD,
    "video_token": tt.VIDEO_PAD,
    "vision_bos_token": tt.VISION_START,
    "vision_eos_token": tt.VISION_END,
}
"""Qwen3-Omni's multimodal tokens, by the attribute names its processor reads."""

CHAT_TEMPLATE = tt.omni_chat_template(
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|audio_start|><|audio_pad|><|audio_end|>",
    "<|vision_start|><|video_pad|><|vision_end|>",
)

TOKENIZER = tt.Flavor(
    "qwen3-omni",
    named_tokens=NAMED_TOKENS,
    more_specials=(tt.TTS_PAD, tt.TTS_TEXT_BOS, tt.TTS_TEXT_EOD),
    chat_template=CHAT_TEMPLATE,
    # Lines that start with the role names, as ChatML puts them after <|im_start|>.
    corpus=tuple(f"{role}\nhello" for role in ("system", "user", "assistant") for _ in range(64)),
)


def _id(token: str) -> int:
    return tt.token_id(token, TOKENIZER)


def _role_id(role: str) -> int:
    ids = tt._trained(TOKENIZER).encode(role, add_special_tokens=False)
    if len(ids) != 1:
        raise RuntimeError(f"the tiny Qwen3-Omni tokenizer splits {role!r} into {ids}")
    return ids[0]


def _thinker_config() -> dict:
    return dict(
        audio_token_id=_id(NAMED_TOKENS["audio_token"]),
        image_token_id=_id(tt.IMAGE_PAD),
        video_token_id=_id(tt.VIDEO_PAD),
        audio_start_token_id=_id(NAMED_TOKENS["audio_bos_token"]),
        audio_end_token_id=_id(NAMED_TOKENS["audio_eos_token"]),
        vision_start_token_id=_id(tt.VISION_START),
        vision_end_token_id=_id(tt.VISION_END),
        user_token_id=_role_id("user"),
        audio_config=dict(
            d_model=64,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=128,
            output_dim=THINKER_HIDDEN,
            downsample_hidden_size=32,
            num_mel_bins=128,  # Whisper's feature extractor, as in the real model
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            out_hidden_size=THINKER_HIDDEN,
            deepstack_visual_indexes=[1],
            # vLLM reads these two: transformers always adds the 48 x 48 learned positions.
            image_size=768,
            apply_vit_abs_pos_embed=True,
        ),
        text_config=dict(
            vocab_size=tt.VOCAB_SIZE,
            hidden_size=THINKER_HIDDEN,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            max_position_embeddings=8192,
            rope_parameters=MROPE,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,  # vLLM reads it
            bos_token_id=_id(tt.ENDOFTEXT),
            eos_token_id=_id(tt.IM_END),
            pad_token_id=_id(tt.ENDOFTEXT),
        ),
    )


def _talker_config() -> dict:
    return dict(
        audio_token_id=_id(NAMED_TOKENS["audio_token"]),
        image_token_id=_id(tt.IMAGE_PAD),
        video_token_id=_id(tt.VIDEO_PAD),
        vision_start_token_id=_id(tt.VISION_START),
        audio_start_token_id=_id(NAMED_TOKENS["audio_bos_token"]),
        spatial_merge_size=2,
        num_code_groups=CODE_GROUPS,
        thinker_hidden_size=THINKER_HIDDEN,
        accept_hidden_layer=ACCEPT_LAYER,
        codec_eos_token_id=CODEC_EOS,
        codec_pad_id=CODEC_PAD,
        codec_bos_id=CODEC_BOS,
        codec_nothink_id=CODEC_NOTHINK,
        codec_think_bos_id=CODEC_THINK_BOS,
        codec_think_eos_id=CODEC_THINK_EOS,
        speaker_id=dict(SPEAKERS),
        text_config=dict(
            vocab_size=CODEBOOK + 1024,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            max_position_embeddings=8192,
            rope_parameters=MROPE,
            rms_norm_eps=1e-6,
        ),
        code_predictor_config=dict(
            vocab_size=CODEBOOK,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            rms_norm_eps=1e-6,
            num_code_groups=CODE_GROUPS,
        ),
    )


def qwen3_omni_config():
    from transformers import Qwen3OmniMoeConfig

    code2wav = dict(
        codebook_size=CODEBOOK,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=128,
        num_quantizers=CODE_GROUPS,
        decoder_dim=64,
    )
    return Qwen3OmniMoeConfig(
        thinker_config=_thinker_config(),
        talker_config=_talker_config(),
        code2wav_config=code2wav,
        im_start_token_id=_id(tt.IM_START),
        im_end_token_id=_id(tt.IM_END),
        tts_pad_token_id=_id(tt.TTS_PAD),
        tts_bos_token_id=_id(tt.TTS_TEXT_BOS),
        tts_eos_token_id=_id(tt.TTS_TEXT_EOD),
        system_token_id=_role_id("system"),
        user_token_id=_role_id("user"),
        assistant_token_id=_role_id("assistant"),
    )


def _processor(out: Path):
    from transformers import (
        AutoTokenizer,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        Qwen3OmniMoeProcessor,
        WhisperFeatureExtractor,
    )

    tt.save_tokenizer(out, TOKENIZER)
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    return Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2),
        video_processor=Qwen2VLVideoProcessor(patch_size=16, merge_size=2),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )


def build_qwen3_omni(out: Path) -> None:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    config = qwen3_omni_config()
    torch.manual_seed(QWEN3_OMNI_SEED)
    model = Qwen3OmniMoeForConditionalGeneration(config)
    heads = {"thinker.lm_head.weight": LOGIT_GAIN, "talker.codec_head.weight": LOGIT_GAIN}
    for i in range(CODE_GROUPS - 1):
        heads[f"talker.code_predictor.lm_head.{i}.weight"] = LOGIT_GAIN
    randomize_(model, QWEN3_OMNI_SEED, heads)
    model.eval()
    model.generation_config = chat_generation_config()
    model.save_pretrained(out, max_shard_size="2MB")  # sharded with an index, as the release
    _processor(out).save_pretrained(str(out))
