# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight AuraFlow, deterministic: a `diffusers.AuraFlowPipeline` folder laid out as
the release (`fal/AuraFlow-v0.3`) with a 2-layer UMT5 text encoder and a T5 tokenizer (the
release's encoder is UMT5's; its tokenizer a Llama one), an MMDiT of one joint and one single
block, SDXL's 4-channel `AutoencoderKL` shrunk to 8 base channels and the flow-matching sampler
with the release's shift.

`build_aura_flow(out)` writes the folder.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.testing.tiny_common import (
    randomize_,
    t5_text_encoder,
    t5_tokenizer,
    tiny_autoencoder_kl,
)

AURA_FLOW_SEED = 1008
TEXT_HIDDEN = 64  # the UMT5 encoder's width; the DiT's joint_attention_dim (the release's 2048)
LATENT_CHANNELS = 4
VAE_SCALING = 0.13025  # SDXL's VAE, as the release uses
FLOW_SHIFT = 1.73  # the release's sampler shift
SAMPLE_SIZE = 8  # latent pixels: the DiT's position grid is laid out for 64 px images


def _transformer():
    """AuraFlow's MMDiT: one joint block, one single block, 2 heads of 32, 2x2 patches."""
    import torch
    from diffusers import AuraFlowTransformer2DModel

    torch.manual_seed(AURA_FLOW_SEED + 1)
    transformer = AuraFlowTransformer2DModel(
        sample_size=SAMPLE_SIZE,
        patch_size=2,
        in_channels=LATENT_CHANNELS,
        num_mmdit_layers=1,
        num_single_dit_layers=1,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=TEXT_HIDDEN,
        caption_projection_dim=64,
        out_channels=LATENT_CHANNELS,
        pos_embed_max_size=256,  # a 16 x 16 grid of patches: images up to 256 px a side
    )
    randomize_(transformer, AURA_FLOW_SEED + 1)
    return transformer


def build_aura_flow(out: Path) -> None:
    from diffusers import AuraFlowPipeline, FlowMatchEulerDiscreteScheduler

    tokenizer = t5_tokenizer()
    pipe = AuraFlowPipeline(
        tokenizer=tokenizer,
        text_encoder=t5_text_encoder(len(tokenizer), AURA_FLOW_SEED, TEXT_HIDDEN, umt5=True),
        vae=tiny_autoencoder_kl(LATENT_CHANNELS, VAE_SCALING, None, SAMPLE_SIZE * 8),
        transformer=_transformer(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=FLOW_SHIFT),
    )
    pipe.save_pretrained(Path(out))
