# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Stable Diffusion 3.5, deterministic: a
`diffusers.StableDiffusion3Pipeline` folder laid out as the release
(`stabilityai/stable-diffusion-3.5-medium`) with two 2-layer CLIP text encoders (with
projection; the second wider, as CLIP-L and CLIP-G), a 2-layer T5 encoder, a 2-layer MMDiT
(SD3.5's dual-attention first block and q/k RMS norms), SD3's `AutoencoderKL` (16 latent
channels) shrunk to 8 base channels and its flow-matching scheduler (shift 3).

`build_sd3(out)` writes the folder; `sd3_vae()` and `sd3_scheduler()` give the VAE and the
scheduler alone.

Nothing is downloaded, so the tokenizers are made here. The two CLIP tokenizers are written as
the release's are (`vocab.json`, `merges.txt`): CLIP's byte-level BPE over the 256 byte symbols,
each also with the `</w>` end-of-word suffix, the merges that spell some common words, and
`<|startoftext|>` / `<|endoftext|>` last; the second pads with "!" as the release's does. The
T5 tokenizer is a `tokenizers` Unigram model (`<pad>`, `</s>`, `<unk>`, the word-start marker,
a few whole words, then single characters) saved as `tokenizer.json`; a word it cannot spell
tokenizes to `<unk>` pieces.

The pipeline's CLIP embeddings (penultimate hidden states of both encoders, side by side:
32 + 64 wide) are zero-padded to the T5 width (128) and put before the T5 tokens, and the two
projected pooled outputs (32 + 64) condition the DiT's time embedding, as in the release.
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_omni.testing.tiny_common import (
    WORDS,
    randomize_,
    t5_text_encoder,
    t5_tokenizer,
    tiny_autoencoder_kl,
)

SD3_SEED = 1006
SD3_CLIP_L_HIDDEN = 32  # text_encoder (CLIP-L in the release: 768)
SD3_CLIP_G_HIDDEN = 64  # text_encoder_2 (CLIP-G in the release: 1280)
SD3_T5_HIDDEN = 128  # text_encoder_3 (T5-XXL in the release: 4096); the DiT's joint_attention_dim
SD3_LATENT_CHANNELS = 16
SD3_VAE_SCALING = 1.5305  # the release VAE's scaling_factor and shift_factor
SD3_VAE_SHIFT = 0.0609
SD3_CLIP_MAX_LENGTH = 77  # the CLIP tokenizers' model_max_length (and position embeddings)
SD3_T5_MAX_LENGTH = 512  # the T5 tokenizer's model_max_length (the pipeline caps at 512)

STARTOFTEXT = "<|startoftext|>"
ENDOFTEXT = "<|endoftext|>"


def _byte_symbols() -> list[str]:
    """The 256 symbols of byte-level BPE, in byte order (printable bytes stand for themselves,
    the others for the code points from U+0100 on, so code-point order is byte order)."""
    from tokenizers import pre_tokenizers

    return sorted(pre_tokenizers.ByteLevel.alphabet())


def _clip_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP's vocabulary layout: the byte symbols, the same with `</w>`, the merged tokens in
    merge order, then `<|startoftext|>` and `<|endoftext|>` (the two highest ids)."""
    symbols = _byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols]
    vocab = {token: i for i, token in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        # Merge left to right: ("r", "e") -> "re", ("re", "d</w>") -> "red</w>".
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            pair = (parts[0], parts[1])
            merged = pair[0] + pair[1]
            if pair not in merges:
                merges.append(pair)
            vocab.setdefault(merged, len(vocab))
            parts = [merged, *parts[2:]]
    vocab[STARTOFTEXT] = len(vocab)
    vocab[ENDOFTEXT] = len(vocab)
    return vocab, merges


def _write_clip_tokenizer(folder: Path, pad_token: str) -> None:
    """Write a CLIP tokenizer folder as the release's: `vocab.json`, `merges.txt`,
    `tokenizer_config.json` and `special_tokens_map.json` (no `tokenizer.json`)."""
    vocab, merges = _clip_vocab_and_merges()
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():
        stale.unlink()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    specials = {
        "bos_token": STARTOFTEXT,
        "eos_token": ENDOFTEXT,
        "pad_token": pad_token,
        "unk_token": ENDOFTEXT,
    }
    config = {
        "tokenizer_class": "CLIPTokenizer",
        "model_max_length": SD3_CLIP_MAX_LENGTH,
        **specials,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def _clip_tokenizer(folder: Path, pad_token: str):
    from transformers import CLIPTokenizer

    _write_clip_tokenizer(folder, pad_token)
    return CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)


def _clip_text_encoder(
    hidden: int, vocab: dict[str, int], hidden_act: str, seed: int, projection: bool = True
):
    """A 2-layer CLIP text encoder; `projection`: with the projection of its pooled output
    (`CLIPTextModelWithProjection`, as SD3's), else without (`CLIPTextModel`, as Flux's)."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        projection_dim=hidden,
        num_hidden_layers=2,
        num_attention_heads=hidden // 32,  # head dim 32
        max_position_embeddings=SD3_CLIP_MAX_LENGTH,
        hidden_act=hidden_act,
        layer_norm_eps=1e-5,
        bos_token_id=vocab[STARTOFTEXT],
        eos_token_id=vocab[ENDOFTEXT],  # the pooled output is the first <|endoftext|>'s
        pad_token_id=vocab[ENDOFTEXT],
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)
    randomize_(model, seed)
    return model


def _sd3_transformer():
    """SD3.5's MMDiT: 2 joint blocks (the first with SD3.5's extra image self-attention, the last
    context-pre-only), q/k RMS norms, 2x2 patches, inner width 64."""
    import torch
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(SD3_SEED + 3)
    transformer = SD3Transformer2DModel(
        sample_size=8,  # latent pixels: the pipeline's default image is 8 * 8 = 64 px square
        patch_size=2,
        in_channels=SD3_LATENT_CHANNELS,
        out_channels=SD3_LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=SD3_T5_HIDDEN,
        caption_projection_dim=64,  # the inner width (heads * head dim), as in the release
        pooled_projection_dim=SD3_CLIP_L_HIDDEN + SD3_CLIP_G_HIDDEN,
        pos_embed_max_size=24,  # 3x sample_size, as the release's 384 for 128: up to 384 px
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )
    randomize_(transformer, SD3_SEED + 3)
    return transformer


def sd3_vae():
    """SD3's VAE (16 latent channels, scaling 1.5305, shift 0.0609), shrunk."""
    return tiny_autoencoder_kl(SD3_LATENT_CHANNELS, SD3_VAE_SCALING, SD3_VAE_SHIFT, 64)


def sd3_scheduler():
    """SD3's sampler: flow matching with a fixed time shift of 3."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)


def resave_sharded(model, folder: Path, max_shard_size: int | str) -> None:
    """Save `model` into `folder` again in shards with an index, as the releases keep their large
    parts (`save_pretrained` of the pipeline wrote one file)."""
    for weights in folder.glob("*.safetensors*"):
        weights.unlink()
    model.save_pretrained(folder, max_shard_size=max_shard_size)


def rewrite_index(out: Path, entries: dict[str, list], drop_absent: bool = False) -> None:
    """Set `entries` in the folder's `model_index.json` (a tokenizer by its release's class
    name); `drop_absent`: leave out the optional components saved as `[null, null]`."""
    index_path = out / "model_index.json"
    index = json.loads(index_path.read_text())
    if drop_absent:
        index = {k: v for k, v in index.items() if v != [None, None]}
    index.update(entries)
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def build_sd3(out: Path) -> None:
    import torch
    from diffusers import StableDiffusion3Pipeline

    out = Path(out)
    clip_vocab, _ = _clip_vocab_and_merges()
    # The release's first CLIP tokenizer pads with <|endoftext|>, its second with "!".
    tokenizer = _clip_tokenizer(out / "tokenizer", ENDOFTEXT)
    tokenizer_2 = _clip_tokenizer(out / "tokenizer_2", "!")
    tokenizer_3 = t5_tokenizer()

    text_encoder = _clip_text_encoder(SD3_CLIP_L_HIDDEN, clip_vocab, "quick_gelu", SD3_SEED)
    text_encoder_2 = _clip_text_encoder(SD3_CLIP_G_HIDDEN, clip_vocab, "gelu", SD3_SEED + 1)
    text_encoder_3 = t5_text_encoder(len(tokenizer_3), SD3_SEED + 2)
    transformer = _sd3_transformer()

    torch.manual_seed(SD3_SEED + 4)
    vae = sd3_vae()
    randomize_(vae, SD3_SEED + 4)

    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=sd3_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )
    pipe.save_pretrained(out)
    # As the release: the CLIP tokenizers as vocab.json + merges.txt (save_pretrained wrote a
    # tokenizer.json in their place), the T5 encoder in shards with an index, the index naming
    # the T5 tokenizer by its fast-tokenizer name.
    _write_clip_tokenizer(out / "tokenizer", ENDOFTEXT)
    _write_clip_tokenizer(out / "tokenizer_2", "!")
    resave_sharded(text_encoder_3, out / "text_encoder_3", "1MB")
    rewrite_index(out, {"tokenizer_3": ["transformers", "T5TokenizerFast"]})
