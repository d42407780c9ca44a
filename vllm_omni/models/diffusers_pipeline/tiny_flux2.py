# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight FLUX.2 [klein], deterministic: a `diffusers.Flux2KleinPipeline` folder
laid out as the release `black-forest-labs/FLUX.2-klein-4B` (the step-distilled 4B:
`is_distilled`, so the pipeline never runs classifier-free guidance and ignores
`guidance_scale`) with a 28-layer Qwen3 text encoder 32 wide (the release's Qwen3-4B: 36 layers,
2560 wide), a FLUX.2 DiT of one double-stream and two single-stream blocks (the release's 5 and
20), the FLUX.2 VAE (`AutoencoderKLFlux2`, 32 latent channels) shrunk to 8 base channels and one
residual block a stage, and the release's flow-matching scheduler.

`build_flux2_klein(out)` writes the folder; `flux2_vae()` and `flux2_scheduler()` give the VAE
and the scheduler alone.

The pipeline writes the prompt as one user turn of the tokenizer's chat template with thinking
off (Qwen3's: the assistant header, then an empty `<think>\\n\\n</think>\\n\\n`), pads it on the
right to `max_sequence_length` (512 unless given) and stacks the text encoder's hidden states
9, 18 and 27 side by side: 3 x 32 = 96 wide, the DiT's `joint_attention_dim` (the release's
3 x 2560 = 7680). 28 layers are the fewest that keep those three (the pipeline's default
`text_encoder_out_layers`) block outputs below the final norm, as the release's 36 do. The DiT
gets no pooled text embedding and, as the release's, embeds no guidance scale.

The tokenizer is the shared tiny byte-level BPE (vllm_omni.testing.tiny_tokenizer) with
`<think>` / `</think>` added and a ChatML template that, as Qwen3's, closes an empty think block
when `enable_thinking` is false. It is loaded back as the release's class, `Qwen2TokenizerFast`,
which splits the text Qwen's way (digits one by one) before the byte-level BPE, and saved so.

The VAE normalises the DiT's latents (2x2 latent patches, 128 channels) with a batch norm's
running statistics, which the release's training set: here they are drawn at random (means near
0, standard deviations near 1) so that the pipeline's de-normalisation is not the identity. As
the release, the text encoder is a `Qwen3ForCausalLM` checkpoint in two shards with an index (its
output projection tied to the embedding), the DiT and the VAE each in one file, and
`model_index.json` names the tokenizer `Qwen2TokenizerFast`.

Sizes should divide by 16 (the VAE's 8x and the 2x2 patches; the pipeline warns and rounds
others down); its default size is 1024 x 1024 whatever the checkpoint. The pipeline's first
parameter is `image` (reference images to edit, each side at least 64 px), so the prompt must be
passed by name. At 64 x 64 a prompt moves the image far less than the seed does (~2-4/255 on
average against ~60): the DiT attends to all 512 text positions, padding included.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.models.diffusers_pipeline.tiny import resave_sharded, rewrite_index
from vllm_omni.models.tiny_qwen3 import qwen3_text_encoder
from vllm_omni.testing import tiny_tokenizer as tt
from vllm_omni.testing.tiny_common import randomize_

FLUX2_KLEIN_SEED = 1021
FLUX2_TEXT_HIDDEN = 32  # Qwen3-4B's 2560
FLUX2_TEXT_LAYERS = 28  # Qwen3-4B's 36; the pipeline reads hidden states 9, 18 and 27
FLUX2_TEXT_TAPS = 3  # hidden states the pipeline stacks: the DiT's joint_attention_dim is 3 x 32
FLUX2_TEXT_MAX_POSITIONS = 40960  # as Qwen3-4B's
FLUX2_LATENT_CHANNELS = 32  # the DiT takes 2x2 latent patches: 128 input channels
FLUX2_HEAD_DIM = 32  # the release's 128, split evenly among the 4 rotary axes (t, h, w, l)
FLUX2_ROPE_AXES = (8, 8, 8, 8)

THINK, END_THINK = "<think>", "</think>"

# ChatML as Qwen3's template writes it for plain text turns; with `enable_thinking=False` the
# generation prompt closes an empty think block, as the pipeline asks.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}{%- endif -%}"
)

TOKENIZER = tt.Flavor("qwen3", more_specials=(THINK, END_THINK), chat_template=CHAT_TEMPLATE)


def _qwen3_tokenizer(folder: Path):
    """The shared tiny BPE with Qwen3's think markers and template, written into `folder` and
    loaded back as the release's tokenizer class."""
    from transformers import Qwen2TokenizerFast

    tt.save_tokenizer(folder, TOKENIZER)
    return Qwen2TokenizerFast.from_pretrained(str(folder), local_files_only=True)


def _qwen3_text_encoder():
    """Qwen3 as the release's, 28 layers of 2 query heads of 16 sharing 1 key/value head, the
    MLP 2x wide."""
    return qwen3_text_encoder(
        width=FLUX2_TEXT_HIDDEN,
        mlp_width=2 * FLUX2_TEXT_HIDDEN,
        layers=FLUX2_TEXT_LAYERS,
        heads=2,
        head_dim=16,
        max_positions=FLUX2_TEXT_MAX_POSITIONS,
        seed=FLUX2_KLEIN_SEED,
        flavor=TOKENIZER,
    )


def _flux2_transformer():
    """FLUX.2's DiT: 1 double-stream block (text and image streams, joint attention) and 2
    single-stream blocks (fused attention and SwiGLU MLP, x3), 2 heads of 32 (inner width 64),
    modulation shared across blocks, 4-axis rotary positions, no biases, no guidance
    embedding."""
    import torch
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(FLUX2_KLEIN_SEED + 1)
    transformer = Flux2Transformer2DModel(
        patch_size=1,  # the pipeline packs the latents' 2x2 patches itself
        in_channels=4 * FLUX2_LATENT_CHANNELS,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=FLUX2_HEAD_DIM,
        num_attention_heads=2,
        joint_attention_dim=FLUX2_TEXT_TAPS * FLUX2_TEXT_HIDDEN,
        timestep_guidance_channels=256,
        mlp_ratio=3.0,
        axes_dims_rope=FLUX2_ROPE_AXES,
        rope_theta=2000,
        eps=1e-6,
        guidance_embeds=False,
    )
    randomize_(transformer, FLUX2_KLEIN_SEED + 1)
    return transformer


def flux2_vae():
    """The FLUX.2 VAE (32 latent channels, quant convs, a batch norm over the 2x2-patched
    latents) shrunk to channels (8, 16, 32, 32) and one residual block a stage, with its four
    stages (8x); default-initialised."""
    from diffusers import AutoencoderKLFlux2

    return AutoencoderKLFlux2(
        block_out_channels=(8, 16, 32, 32),
        layers_per_block=1,
        latent_channels=FLUX2_LATENT_CHANNELS,
        norm_num_groups=4,
        sample_size=1024,
        use_quant_conv=True,
        use_post_quant_conv=True,
        mid_block_add_attention=True,
        batch_norm_eps=1e-4,
        batch_norm_momentum=0.1,
        patch_size=(2, 2),
    )


def _randomize_batch_norm_(vae, seed: int) -> None:
    """Running statistics for the VAE's latent batch norm (not parameters, so `randomize_`
    leaves them at 0 and 1): means 0.1 * N(0, 1), standard deviations 1 + 0.1 * N(0, 1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    bn = vae.bn
    with torch.no_grad():
        bn.running_mean.copy_(0.1 * torch.randn(bn.running_mean.shape, generator=gen))
        std = 1.0 + 0.1 * torch.randn(bn.running_var.shape, generator=gen)
        bn.running_var.copy_(std.square())


def flux2_scheduler():
    """The release's sampler: flow matching with an exponential time shift. The pipeline passes
    its own linear sigmas and a `mu` from the image's token count and the step count (so
    `shift` and the base/max shifts are unused)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
        time_shift_type="exponential",
    )


def build_flux2_klein(out: Path) -> None:
    import torch
    from diffusers import Flux2KleinPipeline

    out = Path(out)
    tokenizer = _qwen3_tokenizer(out / "tokenizer")
    text_encoder = _qwen3_text_encoder()
    transformer = _flux2_transformer()

    torch.manual_seed(FLUX2_KLEIN_SEED + 2)
    vae = flux2_vae()
    randomize_(vae, FLUX2_KLEIN_SEED + 2)
    _randomize_batch_norm_(vae, FLUX2_KLEIN_SEED + 3)

    pipe = Flux2KleinPipeline(
        scheduler=flux2_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=True,
    )
    pipe.save_pretrained(out)
    # As the release: the text encoder in two shards with an index (most in the first), and the
    # index naming the tokenizer by its fast-tokenizer name.
    total = sum(p.numel() * p.element_size() for p in text_encoder.parameters())
    resave_sharded(text_encoder, out / "text_encoder", total * 9 // 10)
    rewrite_index(out, {"tokenizer": ["transformers", "Qwen2TokenizerFast"]})
