# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Qwen2.5-Omni (thinker, talker, token2wav) in the Hugging Face layout,
deterministic.

`build_qwen25_omni(out)` writes a folder that both transformers
(`Qwen2_5OmniForConditionalGeneration.from_pretrained`, which also needs `spk_dict.pt`) and vLLM
(its `Qwen2_5OmniThinkerForConditionalGeneration`, which reads the thinker weights and skips
the rest) load, with a processor that has the Omni special tokens. Shapes follow the rules that
the real model's code imposes (../shared/research/qwen_omni.md, section 1), shrunk:

- thinker: a 2-layer Qwen2 LM, hidden 128, head_dim 64 (vLLM's CPU attention supports 64, not
  16), M-RoPE sections summing to head_dim / 2; audio and vision towers of one or two layers
  whose outputs have the LM's width.
- talker: 2 layers, hidden 96 with an explicit head_dim of 64 (not hidden / heads, as in the
  real checkpoint's 896 / 128), a 64-entry codec vocabulary.
- token2wav: a 2-layer DiT and a BigVGAN whose upsampling (5*3*2*2*2*2) gives 240 samples per
  mel frame, as in the real model: 480 samples (20 ms at 24 kHz) per codec token.
- two voices, "Chelsie" and "Ethan", in `spk_dict.pt`.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.testing import tiny_tokenizer as tt
from vllm_omni.testing.tiny_common import LOGIT_GAIN, chat_generation_config, randomize_

QWEN25_OMNI_SEED = 1004
THINKER_HIDDEN = 128
CODEC_VOCAB = 64
CODEC_PAD, CODEC_BOS, CODEC_EOS, CODEC_MASK = 60, 61, 62, 63
SPEAKERS = ("Chelsie", "Ethan")
# M-RoPE splits head_dim / 2 = 32 rotary frequencies into (time, height, width) sections.
MROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [8, 12, 12]}
TOKENIZER = tt.Flavor(
    "qwen2.5-omni",
    named_tokens=tt.OMNI_NAMED_TOKENS,
    more_specials=(tt.TTS_PAD, tt.TTS_TEXT_BOS, tt.TTS_TEXT_EOD),
    chat_template=tt.OMNI_CHAT_TEMPLATE,
)


def _token_ids() -> dict[str, int]:
    named = {n: tt.token_id(token, TOKENIZER) for n, token in tt.OMNI_NAMED_TOKENS.items()}
    return dict(
        audio_token_index=named["audio_token"],
        image_token_index=named["image_token"],
        video_token_index=named["video_token"],
        audio_start_token_id=named["audio_bos_token"],
        audio_end_token_id=named["audio_eos_token"],
        vision_start_token_id=named["vision_bos_token"],
        vision_end_token_id=named["vision_eos_token"],
    )


def qwen25_omni_config():
    from transformers import Qwen2_5OmniConfig

    ids = _token_ids()
    endoftext, im_end = tt.token_id(tt.ENDOFTEXT), tt.token_id(tt.IM_END)
    thinker = dict(
        **ids,
        user_token_id=tt.token_id(tt.IM_START),
        audio_config=dict(
            d_model=64,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=128,
            output_dim=THINKER_HIDDEN,
            num_mel_bins=128,  # Whisper's feature extractor, as in the real model
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            out_hidden_size=THINKER_HIDDEN,
            fullatt_block_indexes=[1],
        ),
        text_config=dict(
            vocab_size=tt.VOCAB_SIZE,
            hidden_size=THINKER_HIDDEN,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=8192,
            rope_parameters=MROPE,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=endoftext,
            eos_token_id=im_end,
            pad_token_id=endoftext,
        ),
    )
    talker = dict(
        **ids,
        vocab_size=CODEC_VOCAB,
        tts_codec_pad_token_id=CODEC_PAD,
        tts_codec_start_token_id=CODEC_BOS,
        tts_codec_end_token_id=CODEC_EOS,
        tts_codec_mask_token_id=CODEC_MASK,
        tts_text_start_token_id=tt.token_id(tt.TTS_TEXT_BOS, TOKENIZER),
        tts_text_end_token_id=tt.token_id(tt.TTS_TEXT_EOD, TOKENIZER),
        tts_text_pad_token_id=tt.token_id(tt.TTS_PAD, TOKENIZER),
        embedding_size=THINKER_HIDDEN,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        rope_parameters=MROPE,
        rms_norm_eps=1e-6,
    )
    token2wav = dict(
        dit_config=dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            head_dim=32,
            ff_mult=1,
            emb_dim=16,
            enc_emb_dim=16,
            enc_dim=16,
            enc_channels=[16, 16, 16],  # the last must equal the sum of the middle ones
            enc_kernel_sizes=[5, 3, 1],
            enc_dilations=[1, 2, 1],
            enc_attention_channels=8,
            enc_se_channels=8,
            look_ahead_layers=[1],
            look_backward_layers=[0],
            num_embeds=CODEC_VOCAB,  # its table has num_embeds + 1 rows: every codec id fits
            max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        ),
        bigvgan_config=dict(
            upsample_initial_channel=64,
            resblock_kernel_sizes=[3],
            resblock_dilation_sizes=[[1, 3, 5]],
        ),
    )
    return Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, token2wav_config=token2wav
    )


def _speakers(gen, enc_emb_dim: int) -> dict[str, dict]:
    import torch

    # Each voice: the thinker token that starts the talker's text stream, a speaker embedding
    # for the DiT, and a reference mel spectrogram (80 bins) for its speaker encoder. The start
    # tokens are the last two (reserved) ids of the vocabulary, as the real ones are unused ids.
    return {
        name: {
            "bos_token": tt.VOCAB_SIZE - 1 - i,
            "cond": torch.randn(enc_emb_dim, generator=gen),
            "ref_mel": torch.randn(1, 40, 80, generator=gen),
        }
        for i, name in enumerate(SPEAKERS)
    }


def _processor(out: Path):
    from transformers import (
        AutoTokenizer,
        Qwen2_5OmniProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        WhisperFeatureExtractor,
    )

    tt.save_tokenizer(out, TOKENIZER)
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    return Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(),
        video_processor=Qwen2VLVideoProcessor(),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer,
        chat_template=tt.OMNI_CHAT_TEMPLATE,
    )


def build_qwen25_omni(out: Path) -> None:
    import torch
    from transformers import Qwen2_5OmniForConditionalGeneration

    config = qwen25_omni_config()
    torch.manual_seed(QWEN25_OMNI_SEED)
    model = Qwen2_5OmniForConditionalGeneration(config)
    randomize_(
        model,
        QWEN25_OMNI_SEED,
        {"thinker.lm_head.weight": LOGIT_GAIN, "talker.codec_head.weight": LOGIT_GAIN},
    )
    model.eval()  # __init__ leaves it in training mode (the DiT has dropout)
    model.generation_config = chat_generation_config()
    model.save_pretrained(out, max_shard_size="2MB")  # sharded with an index, as the release
    gen = torch.Generator().manual_seed(QWEN25_OMNI_SEED + 1)
    torch.save(_speakers(gen, config.token2wav_config.dit_config.enc_emb_dim), out / "spk_dict.pt")
    _processor(out).save_pretrained(str(out))
