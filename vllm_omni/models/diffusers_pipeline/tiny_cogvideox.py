# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight CogVideoX, deterministic: a `diffusers.CogVideoXPipeline` folder laid out
as the release `zai-org/CogVideoX-2b` (also known by its first name, `THUDM/CogVideoX-2b`): a
2-layer T5 encoder, a CogVideoX DiT of 2 blocks (2x2 spatial patches, the text and video tokens
in one sequence, sin-cos positions as the 2B's, no rotary ones), CogVideoX's causal 3-D VAE (4x in
time, 8x in space) shrunk to 8 base channels, and the release's v-prediction DDIM sampler.

The DiT's sample shape, the pipeline's default when a request gives none, is 9 frames of 64 x 64
(the release's: 49 frames of 480 x 720). The tokenizer is the T5 Unigram tokenizer the other tiny
pipelines share (vllm_omni.testing.tiny_common), padded as the release's to 226 tokens, the DiT's
text length.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.models.diffusers_pipeline.tiny import resave_sharded, rewrite_index
from vllm_omni.testing.tiny_common import T5_HIDDEN, randomize_, t5_text_encoder, t5_tokenizer

COGVIDEOX_SEED = 1013
COGVIDEOX_LATENT_CHANNELS = 16
COGVIDEOX_TEXT_LENGTH = 226  # the release's T5 length, which its DiT's positions are laid out for
COGVIDEOX_VAE_SCALING = 1.15258426  # the 2B release's VAE scaling_factor
SAMPLE_FRAMES, SAMPLE_SIDE = 9, 64  # the default video (the release's 49 frames, 480 x 720)


def _transformer():
    """CogVideoX's DiT: 2 blocks, 2 heads of 16, time embedding 32 wide."""
    import torch
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(COGVIDEOX_SEED + 1)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=COGVIDEOX_LATENT_CHANNELS,
        out_channels=COGVIDEOX_LATENT_CHANNELS,
        time_embed_dim=32,
        text_embed_dim=T5_HIDDEN,
        num_layers=2,
        sample_width=SAMPLE_SIDE // 8,
        sample_height=SAMPLE_SIDE // 8,
        sample_frames=SAMPLE_FRAMES,
        patch_size=2,
        temporal_compression_ratio=4,
        max_text_seq_length=COGVIDEOX_TEXT_LENGTH,
        use_rotary_positional_embeddings=False,
    )
    randomize_(transformer, COGVIDEOX_SEED + 1)
    return transformer


def _vae():
    """CogVideoX's VAE: four down blocks of 8-16 channels (three halve the size, the first two
    also time), 16 latent channels."""
    import torch
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(COGVIDEOX_SEED + 2)
    vae = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        latent_channels=COGVIDEOX_LATENT_CHANNELS,
        layers_per_block=1,
        norm_num_groups=4,
        temporal_compression_ratio=4,
        sample_height=SAMPLE_SIDE,
        sample_width=SAMPLE_SIDE,
        scaling_factor=COGVIDEOX_VAE_SCALING,
    )
    randomize_(vae, COGVIDEOX_SEED + 2)
    return vae


def _scheduler():
    """The 2B release's sampler: DDIM on v-predictions, zero terminal SNR, trailing timesteps."""
    from diffusers import CogVideoXDDIMScheduler

    return CogVideoXDDIMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=True,
        steps_offset=0,
        prediction_type="v_prediction",
        rescale_betas_zero_snr=True,
        timestep_spacing="trailing",
        snr_shift_scale=3.0,
    )


def build_cogvideox(out: Path) -> None:
    from diffusers import CogVideoXPipeline

    out = Path(out)
    tokenizer = t5_tokenizer()
    tokenizer.model_max_length = COGVIDEOX_TEXT_LENGTH
    text_encoder = t5_text_encoder(len(tokenizer), COGVIDEOX_SEED)
    pipe = CogVideoXPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        transformer=_transformer(),
        vae=_vae(),
        scheduler=_scheduler(),
    )
    pipe.save_pretrained(out)
    # As the release: the T5 encoder in shards with an index, the tokenizer named by the class
    # the release's index names.
    resave_sharded(text_encoder, out / "text_encoder", "1MB")
    rewrite_index(out, {"tokenizer": ["transformers", "T5Tokenizer"]}, drop_absent=True)
