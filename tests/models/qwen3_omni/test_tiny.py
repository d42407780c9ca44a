# SPDX-License-Identifier: Apache-2.0
"""The tiny Qwen3-Omni loads and speaks in transformers, its tokenizer and processor handle
roles, text, image and audio as the real ones do, and vLLM reads it as its Qwen3-Omni thinker."""

import numpy as np
import pytest
import torch

from vllm_omni.models.qwen3_omni import tiny as tiny_omni
from vllm_omni.testing import tiny_tokenizer as tt


@pytest.fixture(scope="module")
def omni_dir(tiny_models):
    return tiny_models["qwen3-omni"]


@pytest.fixture(scope="module")
def hf_model(omni_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni_dir, dtype=torch.float32)


def test_build_is_deterministic(omni_dir, tmp_path):
    import hashlib

    from vllm_omni.testing import tiny

    def digests(folder):
        return {
            str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*"))
            if f.is_file()
        }

    built = tiny.build_tiny_models(tmp_path, ["qwen3-omni"])["qwen3-omni"]
    assert digests(built) == digests(omni_dir)


def test_shapes_follow_the_real_checkpoint_rules(hf_model):
    config = hf_model.config
    thinker_text = config.thinker_config.text_config
    talker = config.talker_config
    assert talker.thinker_hidden_size == thinker_text.hidden_size
    assert 0 < talker.accept_hidden_layer < thinker_text.num_hidden_layers
    # transformers suppresses the last 1024 ids of the talker's vocabulary but the end token:
    # every codec special id lives there, every code below.
    specials = [talker.codec_pad_id, talker.codec_bos_id, talker.codec_eos_token_id]
    specials += [talker.codec_nothink_id, talker.codec_think_bos_id, talker.codec_think_eos_id]
    specials += list(talker.speaker_id.values())
    vocab = talker.text_config.vocab_size
    assert vocab == talker.code_predictor_config.vocab_size + 1024
    assert all(vocab - 1024 <= i < vocab for i in specials)
    assert config.code2wav_config.num_quantizers == talker.num_code_groups
    assert config.code2wav_config.codebook_size == talker.code_predictor_config.vocab_size
    assert thinker_text.num_experts > thinker_text.num_experts_per_tok > 1
    assert talker.text_config.num_experts > talker.text_config.num_experts_per_tok > 1
    assert sorted(talker.speaker_id) == sorted(tiny_omni.SPEAKERS)
    assert not hf_model.training


def test_roles_are_single_tokens(hf_model, omni_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(omni_dir)
    config = hf_model.config
    for role, expected in [
        ("system", config.system_token_id),
        ("user", config.user_token_id),
        ("assistant", config.assistant_token_id),
    ]:
        ids = tokenizer(f"<|im_start|>{role}\nhi").input_ids
        assert ids[:2] == [config.im_start_token_id, expected], role
    # The common special tokens keep their ids across the tiny tokenizers.
    assert config.im_start_token_id == tt.token_id(tt.IM_START)


def test_processor_expands_image_and_audio(omni_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(omni_dir)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "audio"},
                {"type": "text", "text": "What do you see and hear?"},
            ],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|vision_start|><|image_pad|><|vision_end|>" in text
    assert "<|audio_start|><|audio_pad|><|audio_end|>" in text
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    audio = np.zeros(16_000, dtype=np.float32)  # 1 s at 16 kHz
    inputs = processor(text=text, images=[image], audio=[audio], return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    image_pad = tt.token_id(tt.IMAGE_PAD, tiny_omni.TOKENIZER)
    audio_pad = tt.token_id("<|audio_pad|>", tiny_omni.TOKENIZER)
    assert ids.count(image_pad) == 4  # 64x64: 4x4 patches of 16, merged 2x2
    assert ids.count(audio_pad) == 13  # 100 mel frames, downsampled 8x (rounded up)


def test_generates_text_and_speech(hf_model, omni_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(omni_dir)
    text = processor.apply_chat_template(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True, tokenize=False
    )
    inputs = processor(text=text, return_tensors="pt")
    with torch.no_grad():
        sequences, wav = hf_model.generate(
            **inputs,
            speaker="Ethan",
            thinker_max_new_tokens=8,
            thinker_do_sample=False,
            talker_max_new_tokens=12,
            talker_do_sample=False,
        )
    assert sequences.shape[1] > inputs["input_ids"].shape[1]
    assert wav.shape[:2] == (1, 1) and wav.numel() > 0 and torch.isfinite(wav).all()
    # 1920 samples per frame (80 ms at 24 kHz), less what the causal convolutions hold back.
    frames = -(-wav.shape[-1] // 1920)
    assert 1 <= frames <= 11


def test_vllm_resolves_the_thinker(omni_dir):
    from vllm.engine.arg_utils import EngineArgs

    model_config = EngineArgs(model=str(omni_dir), max_model_len=2048).create_model_config()
    assert model_config.architecture == "Qwen3OmniMoeForConditionalGeneration"
    assert model_config.get_vocab_size() == tt.VOCAB_SIZE
    assert model_config.get_head_size() == 64  # a head size vLLM's CPU attention supports
