# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Qwen-Image, deterministic: a `diffusers.QwenImagePipeline` folder laid
out as the release (`Qwen/Qwen-Image`) with a 2-layer Qwen2.5-VL text encoder, a 2-layer MMDiT
transformer, Qwen-Image's VAE shrunk to 8 base channels and its flow-matching scheduler.

`build_qwen_image(out)` writes the folder; `qwen_image_vae()` and `qwen_image_scheduler()` give
the VAE and the scheduler alone (benchmarks build their own pipelines from them).
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.models import tiny_tokenizer as tt
from vllm_omni.models.tiny_common import LOGIT_GAIN, randomize_

QWEN_IMAGE_SEED = 1003
QWEN_IMAGE_TEXT_HIDDEN = 128
QWEN_IMAGE_Z_DIM = 16  # as in Qwen-Image; the transformer's in_channels is 4 * z_dim (2x2 packing)


def _qwen_image_text_encoder():
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    head_dim = 64  # vLLM's CPU attention rejects 16; this encoder also runs in vLLM (pooling)
    num_heads = QWEN_IMAGE_TEXT_HIDDEN // head_dim
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=tt.VOCAB_SIZE,
            hidden_size=QWEN_IMAGE_TEXT_HIDDEN,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=num_heads,
            num_key_value_heads=1,
            max_position_embeddings=8192,
            max_window_layers=2,
            rms_norm_eps=1e-6,
            # M-RoPE splits head_dim / 2 rotary frequencies into (time, height, width) sections.
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1_000_000.0,
                "mrope_section": [8, 12, 12],
            },
            bos_token_id=tt.token_id(tt.ENDOFTEXT),
            eos_token_id=tt.token_id(tt.IM_END),
            pad_token_id=tt.token_id(tt.ENDOFTEXT),
            dtype="float32",
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            out_hidden_size=QWEN_IMAGE_TEXT_HIDDEN,
            fullatt_block_indexes=[1],
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            tokens_per_second=2,
        ),
        image_token_id=tt.token_id(tt.IMAGE_PAD),
        video_token_id=tt.token_id(tt.VIDEO_PAD),
        vision_start_token_id=tt.token_id(tt.VISION_START),
        vision_end_token_id=tt.token_id(tt.VISION_END),
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(QWEN_IMAGE_SEED)
    model = Qwen2_5_VLForConditionalGeneration(config)
    randomize_(model, QWEN_IMAGE_SEED, {"lm_head.weight": LOGIT_GAIN})
    return model


def qwen_image_vae():
    """Qwen-Image's VAE architecture, shrunk (8 base channels, one residual block per stage) but
    with its latent width (z_dim 16) and 8x spatial compression; default-initialised."""
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=QWEN_IMAGE_Z_DIM,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],  # 3 stages: 8x spatial compression
        latents_mean=[0.0] * QWEN_IMAGE_Z_DIM,
        latents_std=[1.0] * QWEN_IMAGE_Z_DIM,
    )


def qwen_image_scheduler():
    """Qwen-Image's own sampler: flow matching with a resolution-dependent ("dynamic")
    exponential time shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=0.9,
        base_image_seq_len=256,
        max_image_seq_len=8192,
        shift_terminal=0.02,
        time_shift_type="exponential",
    )


def build_qwen_image(out: Path) -> None:
    import torch
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import AutoTokenizer

    text_encoder = _qwen_image_text_encoder()

    torch.manual_seed(QWEN_IMAGE_SEED + 1)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=4 * QWEN_IMAGE_Z_DIM,
        out_channels=QWEN_IMAGE_Z_DIM,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=QWEN_IMAGE_TEXT_HIDDEN,
        axes_dims_rope=(8, 12, 12),  # (frame, height, width); sums to attention_head_dim
    )
    randomize_(transformer, QWEN_IMAGE_SEED + 1)

    torch.manual_seed(QWEN_IMAGE_SEED + 2)
    vae = qwen_image_vae()
    randomize_(vae, QWEN_IMAGE_SEED + 2)
    scheduler = qwen_image_scheduler()

    # Save the tokenizer first and load it back, so the pipeline records the class that
    # `from_pretrained` will construct (the generic fast tokenizer; `Qwen2Tokenizer` would
    # replace our pre-tokenizer with Qwen's and tokenize differently).
    tok_dir = out / "tokenizer"
    tt.save_tokenizer(tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    pipe = QwenImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipe.save_pretrained(out)
    # As the release: the text encoder and transformer in shards with an index (the VAE in
    # one file), the tokenizer in its own folder only.
    for name, module, shard in (
        ("text_encoder", text_encoder, "1MB"),
        ("transformer", transformer, "512KB"),
    ):
        for weights in (out / name).glob("*.safetensors"):
            weights.unlink()
        module.save_pretrained(out / name, max_shard_size=shard)
