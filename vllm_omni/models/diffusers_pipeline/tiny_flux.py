# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight FLUX.1 [dev] and [schnell], deterministic: `diffusers.FluxPipeline`
folders laid out as the releases (`black-forest-labs/FLUX.1-dev`,
`black-forest-labs/FLUX.1-schnell`) with a 2-layer CLIP text encoder without projection (as
CLIP-L), a 2-layer T5 encoder, a Flux DiT of one double-stream and two single-stream blocks
(the releases' 19 and 38), Flux's `AutoencoderKL` (16 latent channels) shrunk to 8 base channels
and each release's flow-matching scheduler.

`build_flux_dev(out)` and `build_flux_schnell(out)` write the folders; `flux_vae()`,
`flux_dev_scheduler()` and `flux_schnell_scheduler()` give the VAE and the schedulers alone.

The two differ as the releases do: [dev] is guidance-distilled (its DiT embeds the guidance
scale beside the timestep, `guidance_embeds`) and its scheduler shifts the timesteps by the
image's size (`use_dynamic_shifting`: mu from the latent token count, 0.5 at 256 tokens to 1.15
at 4096); [schnell] embeds no guidance and samples with no shift. The tokenizers, text encoders
and VAE are the same bytes in both, as the releases share theirs.

The tokenizers are the SD3 builder's (vllm_omni.models.diffusers_pipeline.tiny): the CLIP one
as `vocab.json` and `merges.txt`, padding with `<|endoftext|>` as CLIP-L's; the T5 one as a
`tokenizer.json`. The pipeline conditions the DiT's time embedding on CLIP's pooled output (the
hidden state at the first `<|endoftext|>`, 32 wide) and attends to the T5 tokens (128 wide,
padded to the call's `max_sequence_length`, 512 unless given). As the releases, the T5 encoder
and the DiT are saved in shards with an index, and `model_index.json` names the T5 tokenizer by
its fast-tokenizer name and lists no IP-adapter image encoder.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.models.diffusers_pipeline.tiny import (
    ENDOFTEXT,
    _clip_text_encoder,
    _clip_tokenizer,
    _clip_vocab_and_merges,
    _write_clip_tokenizer,
    resave_sharded,
    rewrite_index,
)
from vllm_omni.testing.tiny_common import (
    T5_HIDDEN,
    randomize_,
    t5_text_encoder,
    t5_tokenizer,
    tiny_autoencoder_kl,
)

FLUX_SEED = 1009
FLUX_CLIP_HIDDEN = 32  # text_encoder (CLIP-L in the releases: 768); the DiT's pooled_projection_dim
FLUX_LATENT_CHANNELS = 16  # the DiT packs 2x2 latent patches: 64 input channels
FLUX_VAE_SCALING = 0.3611  # the releases' VAE scaling_factor and shift_factor
FLUX_VAE_SHIFT = 0.1159
FLUX_HEAD_DIM = 32  # the releases': 128, split (16, 56, 56) among the rotary axes
FLUX_ROPE_AXES = (4, 14, 14)  # (text/id, row, column), in the releases' proportions


def _flux_transformer(guidance_embeds: bool, seed: int):
    """Flux's DiT: 1 double-stream block (text and image streams, joint attention) and 2
    single-stream blocks, 2 heads of 32 (inner width 64), q/k RMS norms, 3-axis rotary
    positions; `guidance_embeds`: [dev]'s guidance embedding."""
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,  # the pipeline packs the latents' 2x2 patches itself
        in_channels=4 * FLUX_LATENT_CHANNELS,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=FLUX_HEAD_DIM,
        num_attention_heads=2,
        joint_attention_dim=T5_HIDDEN,
        pooled_projection_dim=FLUX_CLIP_HIDDEN,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=FLUX_ROPE_AXES,
    )
    randomize_(transformer, seed)
    return transformer


def flux_vae():
    """Flux's VAE (16 latent channels, scaling 0.3611, shift 0.1159), shrunk."""
    return tiny_autoencoder_kl(FLUX_LATENT_CHANNELS, FLUX_VAE_SCALING, FLUX_VAE_SHIFT, 1024)


def flux_dev_scheduler():
    """[dev]'s sampler: flow matching, the shift set per image from its latent token count."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,  # unused: dynamic shifting replaces it
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )


def flux_schnell_scheduler():
    """[schnell]'s sampler: flow matching with no time shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False
    )


def _build_flux(out: Path, guidance_embeds: bool, scheduler, transformer_seed: int) -> None:
    import torch
    from diffusers import FluxPipeline

    out = Path(out)
    clip_vocab, _ = _clip_vocab_and_merges()
    tokenizer = _clip_tokenizer(out / "tokenizer", ENDOFTEXT)
    tokenizer_2 = t5_tokenizer()

    text_encoder = _clip_text_encoder(
        FLUX_CLIP_HIDDEN, clip_vocab, "quick_gelu", FLUX_SEED, projection=False
    )
    text_encoder_2 = t5_text_encoder(len(tokenizer_2), FLUX_SEED + 1)
    transformer = _flux_transformer(guidance_embeds, transformer_seed)

    torch.manual_seed(FLUX_SEED + 2)
    vae = flux_vae()
    randomize_(vae, FLUX_SEED + 2)

    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    pipe.save_pretrained(out)
    # As the releases: the CLIP tokenizer as vocab.json + merges.txt (save_pretrained wrote a
    # tokenizer.json in their place), the T5 encoder in 2 shards and the DiT in 3 with an index,
    # the index naming the T5 tokenizer by its fast-tokenizer name and no absent components.
    _write_clip_tokenizer(out / "tokenizer", ENDOFTEXT)
    resave_sharded(text_encoder_2, out / "text_encoder_2", "1MB")
    resave_sharded(transformer, out / "transformer", "600KB")
    rewrite_index(out, {"tokenizer_2": ["transformers", "T5TokenizerFast"]}, drop_absent=True)


def build_flux_dev(out: Path) -> None:
    _build_flux(out, True, flux_dev_scheduler(), FLUX_SEED + 3)


def build_flux_schnell(out: Path) -> None:
    _build_flux(out, False, flux_schnell_scheduler(), FLUX_SEED + 4)
