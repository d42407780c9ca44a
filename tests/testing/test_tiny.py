# SPDX-License-Identifier: Apache-2.0
"""The tiny model generator: determinism, caching, and that transformers, vLLM and diffusers
load and run what it writes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from vllm_omni.models.plain_lm.tiny import TinyLMConfig
from vllm_omni.testing import tiny
from vllm_omni.testing import tiny_tokenizer as tt

from ..helpers.greedy_reference import TEXT_NEW_TOKENS as NEW_TOKENS
from ..helpers.greedy_reference import TEXT_PROMPTS as PROMPTS
from ..helpers.hf_reference import MIN_LOGIT_GAP, one_thread, text_greedy_with_gap

LMS = ["llama-8l", "qwen2-2l"]


def _file_digests(folder: Path) -> dict[str, str]:
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_training_is_deterministic(tiny_models: dict[str, Path]) -> None:
    first = tt.train_tokenizer().backend_tokenizer.to_str()
    second = tt.train_tokenizer().backend_tokenizer.to_str()
    assert first == second
    # The cached copy may come from another process (different hash seeds, thread timing).
    saved = json.loads((tiny_models["qwen2-2l"] / "tokenizer.json").read_text())
    fresh = json.loads(first)
    assert saved["model"]["vocab"] == fresh["model"]["vocab"]
    assert saved["model"]["merges"] == fresh["model"]["merges"]
    assert len(fresh["model"]["vocab"]) > 1500  # the corpus supports a real BPE vocabulary


def test_tokenizer_special_tokens_and_chat_template(tiny_models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models["qwen2-2l"])
    assert len(tok) == tt.VOCAB_SIZE
    assert tok.eos_token == tt.IM_END and tok.pad_token == tt.ENDOFTEXT
    for special in tt.SPECIAL_TOKENS:
        ids = tok.encode(f"a{special}b", add_special_tokens=False)
        assert tok.convert_tokens_to_ids(special) in ids, special
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special

    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == no_prompt + "<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text  # byte-level BPE round-trips exactly
    assert tok.decode(ids, skip_special_tokens=True).startswith("system\nYou are")


# --------------------------------------------------------------------------- generator


def test_build_is_cached(tiny_models: dict[str, Path]) -> None:
    names = ["qwen2-2l", "z-image"]

    def written() -> dict[str, int]:  # a rebuild writes the marker afresh
        return {name: (tiny_models[name] / tiny.MARKER).stat().st_mtime_ns for name in names}

    before = written()
    again = tiny.build_tiny_models(tiny.default_models_dir(), names)
    assert again == {name: tiny_models[name] for name in names}
    assert written() == before
    for name in names:
        assert tiny.is_complete(tiny_models[name]), name


def test_models_are_built_on_first_use(tmp_path: Path) -> None:
    models = tiny.TinyModels(tmp_path)
    assert "qwen2-2l" in models and "no-such-model" not in models
    assert not list(tmp_path.iterdir())  # asking what exists builds nothing
    assert models["qwen2-2l"] == tmp_path / "qwen2-2l"
    assert [p.name for p in tmp_path.iterdir()] == ["qwen2-2l"]  # that one only
    assert set(models) == set(tiny.tiny_models()) and len(models) == len(tiny.tiny_models())


def test_build_is_byte_identical_and_rebuilds_stale(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    built = tiny.build_tiny_models(tmp_path, ["qwen2-2l"])["qwen2-2l"]
    assert _file_digests(built) == _file_digests(tiny_models["qwen2-2l"])

    # A folder from another generator version, or one without its marker, is rebuilt.
    (built / tiny.MARKER).write_text("stale\n")
    (built / "model.safetensors").write_bytes(b"garbage")
    tiny.build_tiny_models(tmp_path, ["qwen2-2l"])
    assert _file_digests(built) == _file_digests(tiny_models["qwen2-2l"])
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary folders left behind

    with pytest.raises(ValueError, match="names"):
        tiny.build_tiny_models(tmp_path, ["no-such-model"])


def test_lm_config_validation() -> None:
    with pytest.raises(ValueError, match="num_heads \\* head_dim"):
        TinyLMConfig("llama", 1, 100, 2, 1, 64, 128, 1e4, seed=0)
    with pytest.raises(ValueError, match="architecture"):
        TinyLMConfig("gpt2", 1, 128, 2, 1, 64, 128, 1e4, seed=0)


# --------------------------------------------------------------------------- LMs


@pytest.fixture(scope="module")
def hf_greedy(tiny_models: dict[str, Path]) -> dict[str, tuple[list[list[int]], float]]:
    """Greedy continuations in float32 with transformers, and the smallest top-1/top-2 gap."""
    return {name: text_greedy_with_gap(tiny_models[name], PROMPTS, NEW_TOKENS) for name in LMS}


@pytest.mark.parametrize("name", LMS)
def test_lm_transformers_greedy(
    name: str, tiny_models: dict[str, Path], hf_greedy: dict[str, tuple[list[list[int]], float]]
) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_models[name])
    assert _head_dim(config) == 64  # vLLM's CPU attention rejects 16
    assert config.vocab_size == tt.VOCAB_SIZE
    outputs, min_gap = hf_greedy[name]
    # Peaky logits: no near-ties, so a different (correct) kernel cannot flip a greedy token.
    assert min_gap > MIN_LOGIT_GAP
    for ids in outputs:
        assert len(ids) == NEW_TOKENS
        assert len(set(ids)) >= 4, ids  # not collapsed onto one token
    assert len({tuple(ids) for ids in outputs}) == len(PROMPTS)  # depends on the prompt


@pytest.mark.engine
def test_vllm_matches_transformers(
    greedy_reference: dict, hf_greedy: dict[str, tuple[list[list[int]], float]]
) -> None:
    """llama-8l through the session's PP=1 reference engine (tests/conftest.py), float32 and
    with max_model_len 64K; qwen2-2l is checked the same way through `vllm serve --omni`
    (tests/entrypoints/test_cli.py)."""
    assert greedy_reference["text"] == hf_greedy["llama-8l"][0]
    # vLLM renders chats with the tokenizer's ChatML template.
    assert greedy_reference["chat_prompt"] == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


# --------------------------------------------------------------------------- Qwen-Image


@pytest.fixture(scope="module")
def qwen_image(tiny_models: dict[str, Path]):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(tiny_models["qwen-image"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _render(pipe, width: int, height: int, seed: int, prompt: str = "a red cat on a blue sofa"):
    generator = torch.Generator().manual_seed(seed)
    with one_thread():
        return pipe(
            prompt, width=width, height=height, num_inference_steps=2, generator=generator
        ).images[0]


@pytest.mark.parametrize("width,height", [(64, 64), (96, 64)])
def test_qwen_image_renders(qwen_image, width: int, height: int) -> None:
    import numpy as np

    assert qwen_image.vae_scale_factor * 2 == 16  # valid sizes are multiples of 16
    image = _render(qwen_image, width, height, seed=0)
    assert image.size == (width, height)
    pixels = np.asarray(image)
    assert pixels.shape == (height, width, 3)
    assert pixels.std() > 5  # not a flat image
    again = np.asarray(_render(qwen_image, width, height, seed=0))
    assert (pixels == again).all()
    other = np.asarray(_render(qwen_image, width, height, seed=1))
    assert (pixels != other).any()


def test_qwen_image_text_encoder(qwen_image) -> None:
    text = qwen_image.text_encoder.config.text_config
    head_dim = _head_dim(text)
    assert head_dim == 64  # vLLM's CPU attention rejects 16
    rope = text.rope_parameters
    assert sum(rope["mrope_section"]) == head_dim // 2
    assert qwen_image.transformer.config.joint_attention_dim == text.hidden_size
    assert qwen_image.transformer.config.in_channels == 4 * qwen_image.vae.config.z_dim
    config = qwen_image.text_encoder.config
    for token_id in (
        config.image_token_id,
        config.video_token_id,
        config.vision_start_token_id,
        config.vision_end_token_id,
        text.eos_token_id,
    ):
        assert 0 <= token_id < text.vocab_size

    # QwenImagePipeline drops the first 34 tokens of its prompt template; with our tokenizer
    # they must all belong to the template's fixed system part.
    template = qwen_image.prompt_template_encode
    drop = qwen_image.prompt_template_encode_start_idx
    system_part = template.split("<|im_start|>user")[0]
    assert len(qwen_image.tokenizer(system_part).input_ids) > drop


@pytest.mark.parametrize(
    "name, folder, weights",
    [
        ("qwen2.5-omni", ".", "model"),
        ("qwen-image", "text_encoder", "model"),
        ("qwen-image", "transformer", "diffusion_pytorch_model"),
    ],
)
def test_checkpoints_are_sharded_as_the_releases(tiny_models, name, folder, weights) -> None:
    """Where the real repo is sharded, so is the tiny one: shards named as the release's, and
    an index that maps every tensor to the shard that holds it."""
    import json

    from safetensors import safe_open

    root = tiny_models[name] / folder
    index = json.loads((root / f"{weights}.safetensors.index.json").read_text())
    shards = sorted(root.glob(f"{weights}-*-of-*.safetensors"))
    assert len(shards) >= 2 and not (root / f"{weights}.safetensors").exists()
    assert sorted(set(index["weight_map"].values())) == [s.name for s in shards]
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            assert all(index["weight_map"][key] == shard.name for key in f.keys())


def test_layouts_match_the_releases(tiny_models) -> None:
    qwen_image = tiny_models["qwen-image"]
    assert not list((qwen_image / "text_encoder").glob("tokenizer*"))  # only in tokenizer/
    assert (qwen_image / "tokenizer" / "tokenizer_config.json").is_file()
    assert (qwen_image / "vae" / "diffusion_pytorch_model.safetensors").is_file()
    omni = tiny_models["qwen2.5-omni"]
    for name in ("spk_dict.pt", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        assert (omni / name).is_file(), name
