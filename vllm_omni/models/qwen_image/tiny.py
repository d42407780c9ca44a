# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight Qwen-Image pipelines, deterministic: `diffusers` pipeline folders laid out
as the releases, with a 2-layer Qwen2.5-VL text encoder (and its vision tower), a 2-layer MMDiT
transformer, Qwen-Image's VAE shrunk to 8 base channels and its flow-matching scheduler.

- `build_qwen_image(out)`: `QwenImagePipeline` (`Qwen/Qwen-Image`), text to image.
- `build_qwen_image_edit(out)`: `QwenImageEditPipeline` (`Qwen/Qwen-Image-Edit`), one input image.
- `build_qwen_image_edit_plus(out)`: `QwenImageEditPlusPipeline` (`Qwen/Qwen-Image-Edit-2509`),
  one or more input images.

The edit folders add a `processor` (Qwen2.5-VL's image preprocessing and the project tokenizer);
the text encoder's vision tower reads its pixel values. `qwen_image_vae()` and
`qwen_image_scheduler()` give the VAE and the scheduler alone (benchmarks build their own
pipelines from them).
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.testing import tiny_tokenizer as tt
from vllm_omni.testing.tiny_common import LOGIT_GAIN, randomize_

QWEN_IMAGE_SEED = 1003
QWEN_IMAGE_TEXT_HIDDEN = 128
QWEN_IMAGE_Z_DIM = 16  # as in Qwen-Image; the transformer's in_channels is 4 * z_dim (2x2 packing)

# The edit transformers' attention is sharpened (query/key norm scales x3) and weighs more
# against the residual (output projections x4), as a trained edit DiT's does where it copies
# from its input image. With the default init the output hardly depends on the input image
# (its ~4100 latent tokens are averaged): another input image changes a 64x64 edit by ~1/255
# on average; with these gains by ~10/255 (another prompt by ~3/255), so that a wrong
# conditioning path shows.
QWEN_IMAGE_EDIT_QK_GAIN = 3.0
QWEN_IMAGE_EDIT_ATTN_OUT_GAIN = 4.0

# Qwen2.5-VL's vision input, shared by the text encoder's vision tower and the edit pipelines'
# processor (the releases' `processor/` settings): 14-pixel patches of 2 frames, 2x2 patches
# merged into one token, images resized to multiples of 28 holding 56^2 to 28^2 * 16384 pixels,
# CLIP's normalisation.
QWEN_VL_PATCH = 14
QWEN_VL_MERGE = 2
QWEN_VL_TEMPORAL_PATCH = 2
QWEN_VL_PREPROCESS = dict(
    min_pixels=56 * 56,
    max_pixels=28 * 28 * 16384,
    patch_size=QWEN_VL_PATCH,
    temporal_patch_size=QWEN_VL_TEMPORAL_PATCH,
    merge_size=QWEN_VL_MERGE,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)

# ChatML with Qwen2-VL's placeholders for content parts (OpenAI part types); `add_vision_id`
# numbers the images as the Edit-Plus pipeline's own prompt does ("Picture 1: ...").
QWEN_VL_CHAT_TEMPLATE = (
    "{%- set seen = namespace(images=0) -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}"
    "{%- set seen.images = seen.images + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' ~ seen.images ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] in ('video', 'video_url') -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


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
            patch_size=QWEN_VL_PATCH,
            spatial_merge_size=QWEN_VL_MERGE,
            temporal_patch_size=QWEN_VL_TEMPORAL_PATCH,
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


def _qwen_image_transformer(qk_gain: float = 1.0, attn_out_gain: float = 1.0):
    """The MMDiT; the gains scale its query/key norms and its attention output projections."""
    import torch
    from diffusers import QwenImageTransformer2DModel

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
    qk_norms = ("norm_q.weight", "norm_k.weight", "norm_added_q.weight", "norm_added_k.weight")
    gains = {}
    for name, _ in transformer.named_parameters():
        if name.endswith(qk_norms):  # image and text streams
            gains[name] = qk_gain
        elif name.endswith(("attn.to_out.0.weight", "attn.to_add_out.weight")):
            gains[name] = attn_out_gain
    randomize_(transformer, QWEN_IMAGE_SEED + 1, gains)
    return transformer


def _qwen_image_components(out: Path, qk_gain: float = 1.0, attn_out_gain: float = 1.0) -> dict:
    """The modules every Qwen-Image pipeline takes (the gains: the transformer's); writes the
    tokenizer to `out/tokenizer`."""
    import torch
    from transformers import AutoTokenizer

    text_encoder = _qwen_image_text_encoder()
    transformer = _qwen_image_transformer(qk_gain, attn_out_gain)
    torch.manual_seed(QWEN_IMAGE_SEED + 2)
    vae = qwen_image_vae()
    randomize_(vae, QWEN_IMAGE_SEED + 2)

    # Save the tokenizer first and load it back, so the pipeline records the class that
    # `from_pretrained` will construct (the generic fast tokenizer; `Qwen2Tokenizer` would
    # replace our pre-tokenizer with Qwen's and tokenize differently).
    tok_dir = out / "tokenizer"
    tt.save_tokenizer(tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    return dict(
        scheduler=qwen_image_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )


def _save(pipe, out: Path) -> None:
    pipe.save_pretrained(out)
    # As the release: the text encoder and transformer in shards with an index (the VAE in
    # one file), the tokenizer in its own folder only.
    for name, shard in (("text_encoder", "1MB"), ("transformer", "512KB")):
        for weights in (out / name).glob("*.safetensors"):
            weights.unlink()
        getattr(pipe, name).save_pretrained(out / name, max_shard_size=shard)


def build_qwen_image(out: Path) -> None:
    from diffusers import QwenImagePipeline

    _save(QwenImagePipeline(**_qwen_image_components(out)), out)


def _qwen_vl_processor(tokenizer):
    """Qwen2-VL's processor as the edit releases configure it, around the project tokenizer."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    return Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**QWEN_VL_PREPROCESS),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**QWEN_VL_PREPROCESS),
        chat_template=QWEN_VL_CHAT_TEMPLATE,
    )


def _build_edit(out: Path, pipeline_class) -> None:
    parts = _qwen_image_components(out, QWEN_IMAGE_EDIT_QK_GAIN, QWEN_IMAGE_EDIT_ATTN_OUT_GAIN)
    _save(pipeline_class(processor=_qwen_vl_processor(parts["tokenizer"]), **parts), out)


def build_qwen_image_edit(out: Path) -> None:
    from diffusers import QwenImageEditPipeline

    _build_edit(out, QwenImageEditPipeline)


def build_qwen_image_edit_plus(out: Path) -> None:
    from diffusers import QwenImageEditPlusPipeline

    _build_edit(out, QwenImageEditPlusPipeline)
