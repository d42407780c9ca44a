# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight Wan pipelines, deterministic, laid out as the releases:

- `build_wan_t2v(out)`: a `diffusers.WanPipeline` folder as `Wan-AI/Wan2.1-T2V-1.3B-Diffusers`:
  a 2-layer UMT5 encoder, a 2-layer Wan DiT (3-D patches 1x2x2, q/k RMS norms across heads,
  3-D rotary positions), Wan's causal 3-D VAE (4x in time, 8x in space) shrunk to 8 base
  channels, and the release's UniPC flow sampler (shift 3).
- `build_wan22_t2v(out)`: as Wan2.2's `Wan-AI/Wan2.2-T2V-A14B-Diffusers`, two experts: the
  high-noise `transformer` runs the steps above `boundary_ratio` x 1000, `transformer_2` the rest.
- `build_wan_i2v(out)`: a `diffusers.WanImageToVideoPipeline` folder as
  `Wan-AI/Wan2.1-I2V-14B-480P-Diffusers`: as the text-to-video one, plus a 2-layer CLIP vision
  encoder whose penultimate hidden states feed the DiT's image cross-attention, and a DiT that
  takes 36 channels (16 noise, 4 mask, 16 of the VAE-encoded first frame).

The tokenizer is the T5 Unigram tokenizer of the tiny SD3 (diffusers_pipeline/tiny.py), saved as
`T5TokenizerFast` (the release's is UMT5's, of the same class).
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.testing.tiny_common import randomize_, t5_text_encoder, t5_tokenizer

WAN_SEED = 1007
WAN_TEXT_HIDDEN = 64  # the UMT5 encoder's width; the DiT's text_dim (the release's 4096)
WAN_IMAGE_HIDDEN = 32  # the CLIP vision encoder's width; the DiT's image_dim (the release's 1280)
WAN_LATENT_CHANNELS = 16
WAN_FLOW_SHIFT = 3.0  # the 480p releases' sampler shift
WAN22_BOUNDARY_RATIO = 0.875  # Wan2.2 T2V-A14B's switch from the high- to the low-noise expert
CLIP_IMAGE_SIZE = 32


def _transformer(seed: int, in_channels: int = WAN_LATENT_CHANNELS, image_dim: int | None = None):
    """Wan's DiT: 2 blocks, 2 heads of 24 (the rotary split 8/8/8 over frames, height, width)."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=24,
        in_channels=in_channels,
        out_channels=WAN_LATENT_CHANNELS,
        text_dim=WAN_TEXT_HIDDEN,
        freq_dim=64,
        ffn_dim=96,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        image_dim=image_dim,
        added_kv_proj_dim=48 if image_dim is not None else None,  # the inner width, as released
        rope_max_seq_len=1024,
    )
    randomize_(transformer, seed)
    return transformer


def wan_vae(seed: int = WAN_SEED + 2):
    """Wan2.1's causal 3-D VAE (16 latent channels; 4x temporal, 8x spatial), 8 base channels."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=WAN_LATENT_CHANNELS,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True, True],
    )
    randomize_(vae, seed)
    return vae


def wan_scheduler():
    """The releases' sampler: UniPC over flow-matching sigmas, shifted."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=WAN_FLOW_SHIFT,
    )


def _text_parts() -> dict:
    tokenizer = t5_tokenizer()
    encoder = t5_text_encoder(len(tokenizer), WAN_SEED, WAN_TEXT_HIDDEN, umt5=True)
    return {"tokenizer": tokenizer, "text_encoder": encoder}


def build_wan_t2v(out: Path) -> None:
    from diffusers import WanPipeline

    pipe = WanPipeline(
        transformer=_transformer(WAN_SEED + 1),
        vae=wan_vae(),
        scheduler=wan_scheduler(),
        **_text_parts(),
    )
    pipe.save_pretrained(Path(out))


def build_wan22_t2v(out: Path) -> None:
    from diffusers import WanPipeline

    pipe = WanPipeline(
        transformer=_transformer(WAN_SEED + 1),
        transformer_2=_transformer(WAN_SEED + 3),
        vae=wan_vae(),
        scheduler=wan_scheduler(),
        boundary_ratio=WAN22_BOUNDARY_RATIO,
        **_text_parts(),
    )
    pipe.save_pretrained(Path(out))


def _clip_vision():
    import torch
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(
        hidden_size=WAN_IMAGE_HIDDEN,
        intermediate_size=4 * WAN_IMAGE_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=CLIP_IMAGE_SIZE,
        patch_size=8,
        hidden_act="gelu",
        dtype="float32",
    )
    torch.manual_seed(WAN_SEED + 4)
    encoder = CLIPVisionModel(config)
    randomize_(encoder, WAN_SEED + 4)
    processor = CLIPImageProcessor(
        size={"shortest_edge": CLIP_IMAGE_SIZE},
        crop_size={"height": CLIP_IMAGE_SIZE, "width": CLIP_IMAGE_SIZE},
    )
    return encoder, processor


def build_wan_i2v(out: Path) -> None:
    from diffusers import WanImageToVideoPipeline

    image_encoder, image_processor = _clip_vision()
    in_channels = 2 * WAN_LATENT_CHANNELS + 4  # noise, the first-frame mask, the first frame
    pipe = WanImageToVideoPipeline(
        transformer=_transformer(WAN_SEED + 5, in_channels, image_dim=WAN_IMAGE_HIDDEN),
        vae=wan_vae(),
        scheduler=wan_scheduler(),
        image_encoder=image_encoder,
        image_processor=image_processor,
        **_text_parts(),
    )
    pipe.save_pretrained(Path(out))
