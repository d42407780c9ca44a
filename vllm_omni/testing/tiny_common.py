# SPDX-License-Identifier: Apache-2.0
"""What the tiny model builders share: the random weight init (`randomize_`), the output
projection's gain (`LOGIT_GAIN`), the ChatML generation config, the shrunk `AutoencoderKL` of
the pipelines that use Flux's or SD3's VAE (`tiny_autoencoder_kl`), and the smoothing of a
Qwen-Image transformer's time embedding (`smooth_time_embedding_`, used by the tests and
benchmarks that build their own transformers).

The builders themselves live in each family's folder (`vllm_omni/models/*/tiny.py`) and
`vllm_omni/testing/tiny.py` builds them all; this module imports none of them.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any

from vllm_omni.testing import tiny_tokenizer as tt

if TYPE_CHECKING:
    import torch

# Standard deviation of the output projection relative to 1/sqrt(hidden): large enough that the
# logits are peaky (greedy decoding without near-ties, so vLLM and transformers agree token for
# token in float32), small enough that the model does not collapse onto one token.
LOGIT_GAIN = 6.0


def randomize_(model: torch.nn.Module, seed: int, out_gain: dict[str, float] | None = None) -> None:
    """Overwrite every parameter of `model` from a generator seeded with `seed`.

    The libraries' own inits are tuned for training (tiny stds, zero-initialised output layers),
    which makes untrained models print near-uniform logits or blank images. Here each weight
    gets std 1/sqrt(fan_in), so activations keep unit scale through the network, embeddings get
    std 1, norm scales sit near 1 and biases near 0. `out_gain` multiplies the std of the
    parameters whose names it lists.
    """
    import torch

    out_gain = out_gain or {}
    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            is_norm = "norm" in type(module).__name__.lower()
            is_embedding = isinstance(module, torch.nn.Embedding)
            for p_name, param in module.named_parameters(recurse=False):
                if id(param) in seen:  # tied weights: initialise once
                    continue
                seen.add(id(param))
                full = f"{mod_name}.{p_name}" if mod_name else p_name
                if is_norm:
                    base = 1.0 if "bias" not in p_name else 0.0
                    value = base + 0.1 * torch.randn(param.shape, generator=gen)
                elif is_embedding:
                    value = torch.randn(param.shape, generator=gen)
                elif param.dim() == 1:  # biases
                    value = 0.1 * torch.randn(param.shape, generator=gen)
                else:  # linear / conv weights: (out, in, *kernel)
                    fan_in = param[0].numel()
                    value = torch.randn(param.shape, generator=gen) / fan_in**0.5
                value = value * out_gain.get(full, 1.0)
                param.copy_(value.to(param.dtype))


def smooth_time_embedding_(transformer, max_frequency: float) -> None:
    """Damp a Qwen-Image transformer's timestep embedding's response to fast sinusoids: the
    input weight of a sinusoid of frequency f (radians per unit of the 0-1 timestep the
    transformer gets) is scaled by min(1, max_frequency / f).

    A random first layer mixes every sinusoid equally, and the fastest turn by tens of radians
    between neighbouring steps, so an untrained DiT's modulation (and every block's output)
    jumps from step to step like no trained DiT's does. Trained time embeddings respond
    smoothly to t; this gives a random one that property and nothing else."""
    import math

    import torch

    linear = transformer.time_text_embed.timestep_embedder.linear_1
    half = linear.in_features // 2
    # diffusers' Timesteps: frequencies exp(-ln(10000) i / half), the timestep scaled by 1000
    freqs = torch.exp(-math.log(10000) * torch.arange(half) / half) * 1000
    gain = (max_frequency / freqs).clamp(max=1.0)
    with torch.no_grad():
        linear.weight.mul_(torch.cat([gain, gain])[None].to(linear.weight.dtype))


def chat_generation_config():
    """Generation stops at <|im_end|> (end of a ChatML turn) or <|endoftext|>."""
    from transformers import GenerationConfig

    endoftext = tt.token_id(tt.ENDOFTEXT)
    return GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[tt.token_id(tt.IM_END), endoftext],
        pad_token_id=endoftext,
    )  # fmt: skip


def tiny_autoencoder_kl(latent_channels: int, scaling: float, shift: float, sample_size: int):
    """The `AutoencoderKL` of SD3 and Flux-family pipelines (no quant convs, a latent scale and
    shift), shrunk to 8 base channels and one residual block per stage but with its four stages
    (8x spatial compression); default-initialised."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 32, 32),
        layers_per_block=1,
        act_fn="silu",
        latent_channels=latent_channels,
        norm_num_groups=4,
        sample_size=sample_size,
        scaling_factor=scaling,
        shift_factor=shift,
        force_upcast=True,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=True,
    )


T5_HIDDEN = 128  # the tiny T5 encoders' width (T5-XXL in the releases: 4096)
T5_MAX_LENGTH = 512  # the T5 tokenizer's model_max_length (the pipelines cap at 512)

# Words the tiny text encoders' tokenizers know: T5 has each as a whole-word piece, CLIP the
# merges that spell each (a merge learned for an earlier word can win over a later word's: "cat"
# is "c" "at</w>").
WORDS = (
    "a", "an", "the", "of", "and", "in", "on", "with", "at", "by", "photo", "image", "picture",
    "painting", "red", "green", "blue", "white", "black", "yellow", "cat", "dog", "bird", "tree",
    "house", "car", "man", "woman", "sky", "sea", "city", "street", "mountain", "flower",
    "portrait", "light", "small", "large", "old", "bright", "dark", "blurry", "ugly",
)  # fmt: skip


def t5_tokenizer():
    """A T5 tokenizer (Unigram, T5's special ids: <pad> 0, </s> 1, <unk> 2) over the word-start
    marker, `WORDS` as whole words and the printable ASCII characters; no sentinel tokens."""
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
    pieces += [("\u2581" + word, -5.0 - 0.01 * i) for i, word in enumerate(WORDS)]
    chars = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation
    pieces += [(c, -10.0) for c in chars]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=T5_MAX_LENGTH)


def t5_text_encoder(vocab_size: int, seed: int, width: int = T5_HIDDEN, umt5: bool = False) -> Any:
    """T5 v1.1's encoder (gated GELU, relative position buckets), 2 layers of 2 heads; `umt5`:
    UMT5's (the same with position buckets per layer)."""
    import torch
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config_class, model_class = (
        (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    )
    config = config_class(
        vocab_size=-(-vocab_size // 64) * 64,  # padded, as the release's 32128 for 32100 tokens
        d_model=width,
        d_kv=width // 2,
        d_ff=2 * width,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = model_class(config)
    randomize_(model, seed)
    return model
