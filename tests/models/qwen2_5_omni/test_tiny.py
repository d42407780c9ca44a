# SPDX-License-Identifier: Apache-2.0
"""The tiny Qwen2.5-Omni loads and speaks in transformers, its processor handles text, image and
audio, and vLLM reads it as its Qwen2.5-Omni thinker."""

import numpy as np
import pytest
import torch

from vllm_omni.models.qwen2_5_omni import tiny as tiny_omni
from vllm_omni.testing import tiny_tokenizer as tt


@pytest.fixture(scope="module")
def omni_dir(tiny_models):
    return tiny_models["qwen2.5-omni"]


@pytest.fixture(scope="module")
def hf_model(omni_dir):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(omni_dir, dtype=torch.float32)


def test_build_is_deterministic(omni_dir, tmp_path):
    import hashlib

    from vllm_omni.testing import tiny

    def digests(folder):
        return {
            str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*"))
            if f.is_file()
        }

    built = tiny.build_tiny_models(tmp_path, ["qwen2.5-omni"])["qwen2.5-omni"]
    assert digests(built) == digests(omni_dir)


def test_shapes_follow_the_real_checkpoint_rules(hf_model):
    config = hf_model.config
    thinker_text = config.thinker_config.text_config
    talker = config.talker_config
    # The talker's head_dim is explicit, not hidden / heads (896 / 128 in the real model).
    assert talker.head_dim * talker.num_attention_heads != talker.hidden_size
    assert talker.embedding_size == thinker_text.hidden_size
    assert config.thinker_config.audio_config.output_dim == thinker_text.hidden_size
    assert config.thinker_config.vision_config.out_hidden_size == thinker_text.hidden_size
    assert sorted(hf_model.speaker_map) == sorted(tiny_omni.SPEAKERS)
    assert not hf_model.training


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
    assert "<|vision_start|><|IMAGE|><|vision_end|>" in text
    assert "<|audio_bos|><|AUDIO|><|audio_eos|>" in text
    image = np.zeros((56, 56, 3), dtype=np.uint8)
    audio = np.zeros(16_000, dtype=np.float32)  # 1 s at 16 kHz
    inputs = processor(text=text, images=[image], audio=[audio], return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    assert (
        ids.count(tt.token_id("<|IMAGE|>", tiny_omni.TOKENIZER)) == 4
    )  # 56x56: 4x4 patches, 2x2 merge
    assert (
        ids.count(tt.token_id("<|AUDIO|>", tiny_omni.TOKENIZER)) == 25
    )  # 25 audio tokens a second


def test_generates_text_and_speech(hf_model, omni_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(omni_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True, tokenize=False
    )
    input_ids = tokenizer(text, return_tensors="pt").input_ids
    torch.manual_seed(0)
    with torch.no_grad():
        sequences, wav = hf_model.generate(
            input_ids,
            speaker="Ethan",
            thinker_max_new_tokens=8,
            thinker_do_sample=False,
            talker_max_new_tokens=40,
            talker_do_sample=False,
            talker_eos_token_id=[tiny_omni.CODEC_PAD, tiny_omni.CODEC_EOS],
        )
    assert sequences.shape[1] > input_ids.shape[1]
    assert wav.dim() == 1 and wav.numel() > 0 and torch.isfinite(wav).all()
    # 480 samples (2 mel frames of 240) per codec token: whole codec tokens of audio.
    assert wav.numel() % 480 == 0


def test_vllm_resolves_the_thinker(omni_dir):
    from vllm.engine.arg_utils import EngineArgs

    model_config = EngineArgs(model=str(omni_dir), max_model_len=2048).create_model_config()
    assert model_config.architecture == "Qwen2_5OmniForConditionalGeneration"
    assert model_config.get_vocab_size() == tt.VOCAB_SIZE
    assert model_config.get_head_size() == 64  # a head size vLLM's CPU attention supports
