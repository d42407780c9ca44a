# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight Sana and Lumina-Image 2.0, deterministic: the two diffusers pipelines
whose text encoder is Gemma 2 (`Gemma2Model`, its last hidden state for Sana, the one before
for Lumina), each a folder laid out as its release.

- `build_sana(out)`: a `diffusers.SanaPipeline` as `Efficient-Large-Model/Sana_1600M_1024px_
  diffusers`: a 2-layer Gemma 2, a 2-layer linear-attention `SanaTransformer2DModel` (32
  latent channels, 1x1 patches), the deep-compression `AutoencoderDC` (32x: six stages, the
  last three EfficientViT blocks with 5x5 multi-scale attention) shrunk to 8 base channels and
  one layer a stage, and the release's sampler (DPM-Solver++ on flow sigmas, shift 3).
- `build_lumina2(out)`: a `diffusers.Lumina2Pipeline` as `Alpha-VLLM/Lumina-Image-2.0`: the
  same Gemma 2, a 2-layer `Lumina2Transformer2DModel` (GQA 3:1 as the release's 24:8, one noise
  and one context refiner layer, 2x2 patches, 3-axis RoPE), the Flux `AutoencoderKL` (16 latent
  channels) shrunk to 8 base channels, and flow matching with a fixed time shift of 6.

Nothing is downloaded, so the tokenizer is made here, Gemma's way: a `tokenizers` BPE with byte
fallback over the whole text (spaces normalised to the word-start marker "▁", no pre-splitting,
no dummy prefix), saved as `tokenizer.json` by transformers' `GemmaTokenizer` (which adds
`<bos>` in front and pads with `<pad>`). Its vocabulary keeps Gemma's special ids (`<pad>` 0,
`<eos>` 1, `<bos>` 2, `<unk>` 3, `<mask>` 4), then `<start_of_turn>` / `<end_of_turn>` (the chat
template's turn markers), the 256 `<0xNN>` byte tokens, single characters, "▁"-prefixed
pieces spelling `WORDS` and the words of the pipelines' own instructions, and `<unusedN>`
fillers up to a multiple of 64. A word it does not know is spelled a prefix piece then
characters; a character it does not know, as bytes. Both pipelines put an instruction before
the prompt, pad on the right to a fixed length and mask the padding, so every prompt's
embeddings have one shape: Sana encodes its "complex human instruction" (~450 tokens here) and
the prompt, then keeps `<bos>` and the last 299 positions (the prompt's tokens and padding: 300
in all); Lumina pads its system prompt (~50 tokens here) and the prompt to 256. As the
releases, `model_index.json` names the tokenizer `GemmaTokenizerFast` and the Gemma weights are
in two shards with an index; there is no SentencePiece `tokenizer.model`.

Sana bins every requested size to the nearest aspect ratio of the table for its transformer's
`sample_size`, renders that, and resizes the image back: the tiny's `sample_size` is 16 (the
512 px releases'), so it renders at about 512 x 512 (a 16 x 16 latent) whatever size is asked,
where the 1024 px release's 32 would render about 1024 x 1024. Sizes must divide by 32.
Lumina renders the size asked (a multiple of 16; 64 x 64 by default here).

`sana_vae()`, `sana_scheduler()`, `lumina2_vae()` and `lumina2_scheduler()` give those parts
alone; `gemma_tokenizer()` and `gemma2_text_encoder()` the shared text side.
"""

from __future__ import annotations

import string
from pathlib import Path

from vllm_omni.models.diffusers_pipeline.tiny import resave_sharded, rewrite_index
from vllm_omni.testing.tiny_common import WORDS, randomize_, tiny_autoencoder_kl

SANA_SEED = 1011
LUMINA2_SEED = 1012

GEMMA_HIDDEN = 64  # Gemma 2 2B's 2304; Sana's caption_channels and Lumina's cap_feat_dim
GEMMA_HEADS = 4  # GQA 2:1 as the release's 8:4
GEMMA_KV_HEADS = 2
GEMMA_HEAD_DIM = 16
GEMMA_MAX_POSITIONS = 8192  # as the release's; also the tokenizer's model_max_length
GEMMA_VOCAB_MULTIPLE = 64

SANA_LATENT_CHANNELS = 32
SANA_VAE_SCALING = 0.41407  # dc-ae-f32c32-sana-1.0's scaling_factor
SANA_SAMPLE_SIZE = 16  # latent side; selects the pipeline's 512 px aspect-ratio bins
SANA_FLOW_SHIFT = 3.0  # the 512 px and 1024 px releases' (4K: 6)

LUMINA2_LATENT_CHANNELS = 16
LUMINA2_VAE_SCALING = 0.3611  # the Flux VAE's scaling_factor and shift_factor
LUMINA2_VAE_SHIFT = 0.1159
LUMINA2_SAMPLE_SIZE = 8  # latent side: the pipeline's default image is 8 * 8 = 64 px square
LUMINA2_SHIFT = 6.0

# Gemma's special tokens at Gemma's ids, then the chat template's turn markers.
PAD, EOS, BOS, UNK, MASK = "<pad>", "<eos>", "<bos>", "<unk>", "<mask>"
START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"
WORD_START = "\u2581"

# Words the pipelines' own prompt prefixes use often (Sana's complex human instruction,
# Lumina's system prompt), after `WORDS`: so those prefixes are some hundreds of tokens, not
# one a character.
INSTRUCTION_WORDS = (
    "you", "are", "assistant", "designed", "to", "generate", "superior", "images", "degree",
    "text", "alignment", "based", "textual", "prompt", "prompts", "user", "given", "enhance",
    "it", "if", "is", "too", "short", "add", "details", "such", "as", "color", "shape", "size",
    "texture", "spatial", "relationships", "create", "vivid", "concrete", "scenes", "already",
    "detailed", "refine", "existing", "slightly", "without", "here", "examples", "how",
    "transform", "or", "please", "only", "description", "below", "avoid", "including", "any",
    "additional", "commentary", "evaluations", "enhanced", "sleeping", "busy", "scene",
    "featuring", "glowing", "people", "colorful", "clothing", "passing", "glass", "start",
)  # fmt: skip

# Gemma's turn format: <bos>, then per message "<start_of_turn>{user|model}\n{text}<end_of_turn>\n"
# (an assistant turn is the model's; Gemma has no system role: a system message is put before
# the first user message's text), and "<start_of_turn>model\n" to generate.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(prefix='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.prefix = message['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' + ns.prefix + message['content'] | trim -}}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- set ns.prefix = '' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)


# --------------------------------------------------------------------------- tokenizer


def _gemma_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Gemma's vocabulary layout, shrunk: specials, turn markers, byte tokens, characters, the
    "▁"-prefixed word pieces (each merge extends a piece by one character, left to right, so a
    listed word is one piece and every prefix of it another), `<unusedN>` fillers."""
    tokens = [PAD, EOS, BOS, UNK, MASK, START_OF_TURN, END_OF_TURN]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    chars = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation
    tokens += [WORD_START, "\n", *chars]
    vocab = {token: i for i, token in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for word in dict.fromkeys(WORDS + INSTRUCTION_WORDS):
        piece = WORD_START
        for char in word:
            pair = (piece, char)
            piece += char
            if piece not in vocab:
                merges.append(pair)
                vocab[piece] = len(vocab)
    for i in range(-len(vocab) % GEMMA_VOCAB_MULTIPLE):
        vocab[f"<unused{i}>"] = len(vocab)
    return vocab, merges


def gemma_tokenizer():
    """The tiny Gemma tokenizer (a transformers `GemmaTokenizer`, tokenizers-backed), set to pad
    on the right: Sana's conversion saved the release's so, and Lumina's pipeline sets it when
    made (so its folder is saved so too); Gemma's own default is the left."""
    from transformers import GemmaTokenizer

    vocab, merges = _gemma_vocab_and_merges()
    return GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        add_bos_token=True,
        add_eos_token=False,
        padding_side="right",
        model_max_length=GEMMA_MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens=[START_OF_TURN, END_OF_TURN],
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------- models


def gemma2_text_encoder(vocab_size: int, seed: int):
    """Gemma 2's decoder (`Gemma2Model`, the releases' text encoder), 2 layers: one sliding-window
    and one global attention layer, logit soft-capping, gated tanh-GELU MLP 4x wide."""
    import torch
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(
        vocab_size=vocab_size,
        hidden_size=GEMMA_HIDDEN,
        intermediate_size=4 * GEMMA_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=GEMMA_HEADS,
        num_key_value_heads=GEMMA_KV_HEADS,
        head_dim=GEMMA_HEAD_DIM,
        query_pre_attn_scalar=GEMMA_HEAD_DIM,  # as the release's 256 for head_dim 256
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=GEMMA_MAX_POSITIONS,
        sliding_window=4096,  # as the release's: longer than any prompt here
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        use_cache=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Gemma2Model(config)
    randomize_(model, seed)
    return model


def _sana_transformer():
    """Sana's linear DiT: 2 blocks of ReLU linear self-attention (2 heads of 32), cross-attention
    to the caption (2 heads of 32) and a depthwise-conv GLU feed-forward (x2.5), 1x1 patches, no
    positional embedding (as the 1024 px release)."""
    import torch
    from diffusers import SanaTransformer2DModel

    torch.manual_seed(SANA_SEED + 1)
    transformer = SanaTransformer2DModel(
        in_channels=SANA_LATENT_CHANNELS,
        out_channels=SANA_LATENT_CHANNELS,
        num_attention_heads=2,
        attention_head_dim=32,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=32,
        cross_attention_dim=64,
        caption_channels=GEMMA_HIDDEN,
        mlp_ratio=2.5,
        attention_bias=False,
        sample_size=SANA_SAMPLE_SIZE,
        patch_size=1,
        norm_elementwise_affine=False,
        norm_eps=1e-6,
        interpolation_scale=None,
    )
    randomize_(transformer, SANA_SEED + 1)
    return transformer


def sana_vae():
    """dc-ae-f32c32-sana-1.0 (32x, 32 latent channels): 3 residual stages, 3 EfficientViT stages
    (multi-scale linear attention, heads of 8 channels), strided-conv down, interpolating up, RMS
    norms in the decoder; channels (8, 16, 32, 32, 64, 64) for the release's (128 ... 1024), one
    layer a stage. Default-initialised."""
    from diffusers import AutoencoderDC

    block_types = ("ResBlock",) * 3 + ("EfficientViTBlock",) * 3
    channels = (8, 16, 32, 32, 64, 64)
    multiscales = ((), (), (), (5,), (5,), (5,))
    return AutoencoderDC(
        in_channels=3,
        latent_channels=SANA_LATENT_CHANNELS,
        attention_head_dim=8,
        encoder_block_types=block_types,
        decoder_block_types=block_types,
        encoder_block_out_channels=channels,
        decoder_block_out_channels=channels,
        encoder_layers_per_block=(1,) * 6,
        decoder_layers_per_block=(1,) * 6,
        encoder_qkv_multiscales=multiscales,
        decoder_qkv_multiscales=multiscales,
        upsample_block_type="interpolate",
        downsample_block_type="conv",
        decoder_norm_types="rms_norm",
        decoder_act_fns="silu",
        scaling_factor=SANA_VAE_SCALING,
    )


def sana_scheduler():
    """Sana's sampler: second-order DPM-Solver++ on flow-matching sigmas, shift 3."""
    from diffusers import DPMSolverMultistepScheduler

    return DPMSolverMultistepScheduler(
        flow_shift=SANA_FLOW_SHIFT, use_flow_sigmas=True, prediction_type="flow_prediction"
    )


def _lumina2_transformer():
    """Lumina-Image 2.0's Next-DiT: 2 joint layers, a noise refiner and a context refiner layer,
    3 query heads sharing 1 key/value head (24 wide: RoPE over caption position, row and column,
    8 each), 2x2 patches."""
    import torch
    from diffusers import Lumina2Transformer2DModel

    torch.manual_seed(LUMINA2_SEED + 1)
    transformer = Lumina2Transformer2DModel(
        sample_size=LUMINA2_SAMPLE_SIZE,
        patch_size=2,
        in_channels=LUMINA2_LATENT_CHANNELS,
        hidden_size=72,
        num_layers=2,
        num_refiner_layers=1,
        num_attention_heads=3,
        num_kv_heads=1,
        multiple_of=16,
        norm_eps=1e-5,
        scaling_factor=1.0,
        axes_dim_rope=(8, 8, 8),
        axes_lens=(300, 512, 512),
        cap_feat_dim=GEMMA_HIDDEN,
    )
    randomize_(transformer, LUMINA2_SEED + 1)
    return transformer


def lumina2_vae():
    """The Flux VAE (16 latent channels, scaling 0.3611, shift 0.1159), shrunk."""
    return tiny_autoencoder_kl(LUMINA2_LATENT_CHANNELS, LUMINA2_VAE_SCALING, LUMINA2_VAE_SHIFT, 64)


def lumina2_scheduler():
    """Lumina-Image 2.0's sampler: flow matching with a fixed time shift of 6."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=LUMINA2_SHIFT)


# --------------------------------------------------------------------------- folders


def _save_as_release(pipe, out: Path) -> None:
    """Save `pipe`, then as the releases: the Gemma weights in two shards with an index (most
    in the first), and `model_index.json` naming the tokenizer by its fast-tokenizer name."""
    pipe.save_pretrained(out)
    text_encoder = pipe.text_encoder
    total = sum(p.numel() * p.element_size() for p in text_encoder.parameters())
    resave_sharded(text_encoder, out / "text_encoder", total * 9 // 10)
    rewrite_index(out, {"tokenizer": ["transformers", "GemmaTokenizerFast"]})


def _build(out: Path, pipeline_class: type, seed: int, transformer, vae, scheduler) -> None:
    """A Gemma 2 pipeline from the shared text side and its own parts (`transformer` and `vae`
    build them, in that order after the text encoder, the VAE seeded `seed + 2`)."""
    import torch

    tokenizer = gemma_tokenizer()
    text_encoder = gemma2_text_encoder(len(tokenizer), seed)
    denoiser = transformer()
    torch.manual_seed(seed + 2)
    autoencoder = vae()
    randomize_(autoencoder, seed + 2)
    pipe = pipeline_class(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=autoencoder,
        transformer=denoiser,
        scheduler=scheduler,
    )
    _save_as_release(pipe, Path(out))


def build_sana(out: Path) -> None:
    from diffusers import SanaPipeline

    _build(out, SanaPipeline, SANA_SEED, _sana_transformer, sana_vae, sana_scheduler())


def build_lumina2(out: Path) -> None:
    from diffusers import Lumina2Pipeline

    _build(
        out, Lumina2Pipeline, LUMINA2_SEED, _lumina2_transformer, lumina2_vae, lumina2_scheduler()
    )
