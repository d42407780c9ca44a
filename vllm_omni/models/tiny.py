# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight models of real architectures, generated locally and deterministically.

Tests and CPU benchmarks need models that vLLM, transformers and diffusers load through their
normal code paths, but nothing may be downloaded. This module builds them from fixed seeds, so
every run writes the same bytes:

- `llama-8l`: `LlamaForCausalLM`, 8 layers, GQA, 64K context (long-context pipeline parallelism).
- `qwen2-2l`: `Qwen2ForCausalLM`, 2 layers (fast engine tests).
- `qwen-image`: a `diffusers.QwenImagePipeline` folder (Qwen2.5-VL text encoder, MMDiT, VAE).
- `qwen2.5-omni`: `Qwen2_5OmniForConditionalGeneration` (thinker, talker, token2wav, two voices;
  `vllm_omni/models/tiny_omni.py`).

    python -m vllm_omni.models.tiny --out DIR [--only NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_omni.models import tiny_omni
from vllm_omni.models import tiny_tokenizer as tt

if TYPE_CHECKING:
    import torch

MARKER = ".complete"
"""Written last into a finished model folder; holds `generator_hash()`."""

ENV_DIR = "VLLM_OMNI_TINY_DIR"


@dataclass(frozen=True)
class TinyLMConfig:
    """Shape of a tiny decoder-only LM. `head_dim` is 64 because vLLM's CPU attention supports
    only some head sizes (32, 64, 80, ...), and 16 is not one of them."""

    architecture: str  # "llama" or "qwen2"
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    seed: int
    head_dim: int = 64

    def __post_init__(self) -> None:
        if self.architecture not in ("llama", "qwen2"):
            raise ValueError(f"architecture must be 'llama' or 'qwen2', got {self.architecture!r}")
        if self.num_heads * self.head_dim != self.hidden_size:
            raise ValueError(
                f"num_heads * head_dim must equal hidden_size, got {self.num_heads} * "
                f"{self.head_dim} != {self.hidden_size}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )


LLAMA_8L = TinyLMConfig(
    architecture="llama", num_layers=8, hidden_size=256, num_heads=4, num_kv_heads=2,
    intermediate_size=512, max_position_embeddings=65536, rope_theta=1_000_000.0, seed=1001,
)  # fmt: skip
QWEN2_2L = TinyLMConfig(
    architecture="qwen2", num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1,
    intermediate_size=256, max_position_embeddings=8192, rope_theta=1_000_000.0, seed=1002,
)  # fmt: skip

# Standard deviation of the output projection relative to 1/sqrt(hidden): large enough that the
# logits are peaky (greedy decoding without near-ties, so vLLM and transformers agree token for
# token in float32), small enough that the model does not collapse onto one token.
LOGIT_GAIN = 6.0


# --------------------------------------------------------------------------- weight init


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


# --------------------------------------------------------------------------- builders


def chat_generation_config():
    """Generation stops at <|im_end|> (end of a ChatML turn) or <|endoftext|>."""
    from transformers import GenerationConfig

    endoftext = tt.token_id(tt.ENDOFTEXT)
    return GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[tt.token_id(tt.IM_END), endoftext],
        pad_token_id=endoftext,
    )  # fmt: skip


def build_lm(cfg: TinyLMConfig, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tt.save_tokenizer(out)
    endoftext, im_end = tt.token_id(tt.ENDOFTEXT), tt.token_id(tt.IM_END)
    common = dict(
        vocab_size=tt.VOCAB_SIZE,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        dtype="bfloat16",
    )
    if cfg.architecture == "llama":
        config, cls = LlamaConfig(head_dim=cfg.head_dim, **common), LlamaForCausalLM
    else:
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    torch.manual_seed(cfg.seed)
    model = cls(config)
    randomize_(model, cfg.seed, {"lm_head.weight": LOGIT_GAIN})
    model.generation_config = chat_generation_config()
    model.to(torch.bfloat16).save_pretrained(out)


def build_llama_8l(out: Path) -> None:
    build_lm(LLAMA_8L, out)


def build_qwen2_2l(out: Path) -> None:
    build_lm(QWEN2_2L, out)


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


TINY_MODELS: dict[str, Callable[[Path], None]] = {
    "llama-8l": build_llama_8l,
    "qwen2-2l": build_qwen2_2l,
    "qwen-image": build_qwen_image,
    "qwen2.5-omni": tiny_omni.build_qwen25_omni,
}


# --------------------------------------------------------------------------- cache


def default_models_dir() -> Path:
    """`$VLLM_OMNI_TINY_DIR`, else `~/.cache/vllm_omni/tiny-models`."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path.home() / ".cache" / "vllm_omni" / "tiny-models"


def generator_hash() -> str:
    """Hash of what decides the generated bytes: this module's sources and library versions."""
    h = hashlib.sha256()
    for source in (Path(__file__), Path(tt.__file__), Path(tiny_omni.__file__)):
        h.update(source.read_bytes())
    for dist in ("torch", "transformers", "diffusers", "tokenizers", "safetensors"):
        try:
            h.update(f"{dist}={metadata.version(dist)}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none\n".encode())
    return h.hexdigest()[:16]


def is_complete(folder: Path, digest: str | None = None) -> bool:
    marker = folder / MARKER
    return marker.is_file() and marker.read_text().strip() == (digest or generator_hash())


def build_tiny_models(
    out_dir: Path, names: Iterable[str] | None = None, *, verbose: bool = False
) -> dict[str, Path]:
    """Build the named tiny models (default: all) under `out_dir`; returns name -> folder.

    Idempotent and safe against concurrent callers: a model is built in a temporary sibling
    folder, its marker written last, and the folder renamed into place; a folder whose marker
    matches the current generator is reused as is.
    """
    out_dir = Path(out_dir)
    names = list(TINY_MODELS) if names is None else list(names)
    unknown = [n for n in names if n not in TINY_MODELS]
    if unknown:
        raise ValueError(f"names: unknown tiny model(s) {unknown}; known: {list(TINY_MODELS)}")
    digest = generator_hash()
    paths: dict[str, Path] = {}
    for name in names:
        final = out_dir / name
        paths[name] = final
        if is_complete(final, digest):
            continue
        start = time.monotonic()
        if verbose:
            print(f"[tiny] building {name} ...", file=sys.stderr, flush=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            TINY_MODELS[name](tmp)
            (tmp / MARKER).write_text(digest + "\n")
            if final.exists() and not is_complete(final, digest):
                shutil.rmtree(final)  # stale (older generator) or half-written
            try:
                tmp.rename(final)
            except OSError:
                if not is_complete(final, digest):  # someone else won the race: fine if done
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if verbose:
            size = _folder_bytes(final) / 2**20
            took = time.monotonic() - start
            print(f"[tiny] built {name}: {size:.1f} MiB in {took:.1f} s", file=sys.stderr)
    return paths


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_omni.models.tiny",
        description="Generate tiny random-weight models (deterministic, no download).",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"output folder (default: ${ENV_DIR} or ~/.cache)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=list(TINY_MODELS), metavar="NAME",
        help=f"build only these models ({', '.join(TINY_MODELS)})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else default_models_dir()
    for name, path in build_tiny_models(out, args.only, verbose=True).items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
