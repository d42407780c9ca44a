# SPDX-License-Identifier: Apache-2.0
"""A tiny random-weight Z-Image, deterministic: a `diffusers.ZImagePipeline` folder laid out as
the release (`Tongyi-MAI/Z-Image-Turbo`) with a 2-layer Qwen3 text encoder, a 2-layer
single-stream DiT, a Flux-style `AutoencoderKL` shrunk to 8 base channels and Z-Image-Turbo's
flow-matching scheduler.

`build_z_image(out)` writes the folder; `z_image_vae()` and `z_image_scheduler()` give the VAE
and the scheduler alone.

The pipeline encodes a prompt with the tokenizer's chat template (one user turn and the
assistant header), pads it to `max_sequence_length`, and keeps the second-to-last hidden state
(the output of the text encoder's next-to-last layer, before the final norm) of the unpadded
tokens. As the release, `model_index.json` names `Qwen3Model` while `text_encoder/` holds a
`Qwen3ForCausalLM` checkpoint (config architecture and `model.`-prefixed weights, the output
projection tied to the embedding): an architecture vLLM's registry names (it has no
`Qwen3Model`), and one `Qwen3Model.from_pretrained` loads, dropping the prefix.
"""

from __future__ import annotations

from pathlib import Path

from vllm_omni.models.tiny_qwen3 import qwen3_text_encoder
from vllm_omni.testing import tiny_tokenizer as tt
from vllm_omni.testing.tiny_common import randomize_, tiny_autoencoder_kl

Z_IMAGE_SEED = 1005
Z_IMAGE_TEXT_HIDDEN = 128  # the transformer's cap_feat_dim
Z_IMAGE_LATENT_CHANNELS = 16  # as in Z-Image (the Flux VAE); the DiT packs 2x2 latent patches
Z_IMAGE_VAE_SCALING = 0.3611  # the release VAE's scaling_factor and shift_factor
Z_IMAGE_VAE_SHIFT = 0.1159
# Gain on the DiT's query and key norm scales (so x9 on the attention logits). With random
# weights and unit-scale q/k the attention is near uniform: each image token averages all
# caption tokens, most of them the chat template's or padding, and the prompt hardly changes
# the image. Peaked attention (as trained DiTs have) makes the image follow the prompt's
# embeddings: same seed, another prompt changes the 64x64 image by ~7/255 on average, not ~2.
Z_IMAGE_QK_GAIN = 3.0


def _z_image_text_encoder():
    """Qwen3 with the release's shape ratios (GQA, q/k norms, tied embedding), 2 layers."""
    head_dim = 64  # vLLM's CPU attention rejects smaller; this encoder also runs in vLLM
    return qwen3_text_encoder(
        width=Z_IMAGE_TEXT_HIDDEN,
        mlp_width=256,
        layers=2,
        heads=Z_IMAGE_TEXT_HIDDEN // head_dim,
        head_dim=head_dim,
        max_positions=8192,
        seed=Z_IMAGE_SEED,
    )


def _z_image_transformer():
    """Z-Image's single-stream DiT: 2 main layers, 1 noise and 1 caption refiner layer."""
    import torch
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(Z_IMAGE_SEED + 1)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=Z_IMAGE_LATENT_CHANNELS,
        dim=64,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=Z_IMAGE_TEXT_HIDDEN,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[8, 12, 12],  # (caption position / frame, height, width); sums to head dim 32
        axes_lens=[1024, 512, 512],
    )
    qk_norms = {
        name: Z_IMAGE_QK_GAIN
        for name, _ in transformer.named_parameters()
        if name.endswith(("attention.norm_q.weight", "attention.norm_k.weight"))
    }
    randomize_(transformer, Z_IMAGE_SEED + 1, qk_norms)
    return transformer


def z_image_vae():
    """Z-Image's VAE (Flux's: 16 latent channels, scaling 0.3611, shift 0.1159), shrunk."""
    return tiny_autoencoder_kl(
        Z_IMAGE_LATENT_CHANNELS, Z_IMAGE_VAE_SCALING, Z_IMAGE_VAE_SHIFT, 1024
    )


def z_image_scheduler():
    """Z-Image-Turbo's sampler: flow matching with a fixed time shift of 3 (the pipeline passes
    its own linear sigmas and a `mu`, which the scheduler ignores without dynamic shifting)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False
    )


def build_z_image(out: Path) -> None:
    import torch
    from diffusers import ZImagePipeline
    from transformers import AutoTokenizer

    text_encoder = _z_image_text_encoder()
    transformer = _z_image_transformer()

    torch.manual_seed(Z_IMAGE_SEED + 2)
    vae = z_image_vae()
    randomize_(vae, Z_IMAGE_SEED + 2)
    scheduler = z_image_scheduler()

    # Save the tokenizer first and load it back, so the pipeline records the class that
    # `from_pretrained` will construct (the generic fast tokenizer; `Qwen2Tokenizer` would
    # replace our pre-tokenizer with Qwen's and tokenize differently). Its ChatML template
    # gives what Qwen3's gives for one user turn with `enable_thinking=True`.
    tok_dir = out / "tokenizer"
    tt.save_tokenizer(tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    pipe = ZImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder.model,  # the bare `Qwen3Model`, as the release's index names
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipe.save_pretrained(out)
    # As the release: the text encoder as a causal-LM checkpoint and the transformer, each in
    # shards with an index (the VAE in one file), the tokenizer in its own folder only.
    for name, module, shard in (
        ("text_encoder", text_encoder, "1MB"),
        ("transformer", transformer, "1MB"),
    ):
        for weights in (out / name).glob("*.safetensors*"):
            weights.unlink()
        (out / name / "config.json").unlink()
        module.save_pretrained(out / name, max_shard_size=shard)
