# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight models of real architectures, generated locally and deterministically.

Tests and CPU benchmarks need models that vLLM, transformers and diffusers load through their
normal code paths, but nothing may be downloaded. These are built from fixed seeds, so every
run writes the same bytes:

- `llama-8l`: `LlamaForCausalLM`, 8 layers, GQA, 64K context (long-context pipeline parallelism).
- `qwen2-2l`: `Qwen2ForCausalLM`, 2 layers (fast engine tests).
- `qwen-image`: a `diffusers.QwenImagePipeline` folder (Qwen2.5-VL text encoder, MMDiT, VAE).
- `qwen-image-edit`, `qwen-image-edit-plus`: `QwenImageEditPipeline` and
  `QwenImageEditPlusPipeline` folders (the same parts, a Qwen2-VL processor for input images).
- `qwen2.5-omni`: `Qwen2_5OmniForConditionalGeneration` (thinker, talker, token2wav, two voices).
- `qwen3-omni`: `Qwen3OmniMoeForConditionalGeneration` (MoE thinker, MoE talker with its code
  predictor, code2wav, three voices).
- `sd3`: a `diffusers.StableDiffusion3Pipeline` folder (two CLIPs and a T5, MMDiT, VAE).
- `flux-dev`, `flux-schnell`: `diffusers.FluxPipeline` folders (CLIP and T5, Flux's MMDiT with
  and without guidance embedding, VAE), `sana`: `SanaPipeline` (Gemma2, Sana's linear DiT, the
  deep-compression VAE), `lumina2`: `Lumina2Pipeline` (Gemma2, Lumina's DiT, VAE).
- `flux2-klein`: a `diffusers.Flux2KleinPipeline` folder (Qwen3, the FLUX.2 DiT and VAE).
- `cogvideox`: a `diffusers.CogVideoXPipeline` folder (T5, CogVideoX's DiT, its causal 3-D VAE).
- `stable-audio`: a `diffusers.StableAudioPipeline` folder (T5, Stable Audio's DiT, Oobleck VAE).
- `z-image`: a `diffusers.ZImagePipeline` folder (Qwen3 text encoder, single-stream DiT, VAE).
- `wan2.1-t2v`, `wan2.2-t2v`, `wan2.1-i2v`: `diffusers.WanPipeline` (one expert; Wan2.2's two)
  and `WanImageToVideoPipeline` folders (UMT5 text encoder, Wan DiT, Wan's 3-D VAE; CLIP vision).

Each family declares its tiny models (`ModelFamily.tiny_models`, vllm_omni.registry) and keeps
their builders in its folder (`<family>/tiny.py`); what they share is in `tiny_common.py`, the
tokenizer in `tiny_tokenizer.py`. This module builds them by name into a cache folder, each
marked with a hash of what decides its bytes, so a model is built once, on first use.

    python -m vllm_omni.testing.tiny --out DIR [--only NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from pathlib import Path

from vllm_omni.registry import tiny_models
from vllm_omni.testing import tiny_common
from vllm_omni.testing import tiny_tokenizer as tt

MARKER = ".complete"
"""Written last into a finished model folder; holds `generator_hash()`."""

ENV_DIR = "VLLM_OMNI_TINY_DIR"


# --------------------------------------------------------------------------- cache


def default_models_dir() -> Path:
    """`$VLLM_OMNI_TINY_DIR`, else `~/.cache/vllm_omni/tiny-models`."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path.home() / ".cache" / "vllm_omni" / "tiny-models"


def generator_hash(name: str) -> str:
    """Hash of what decides the bytes of tiny model `name`: the sources of this module, of its
    builder's module and of the modules the builders share, and library versions."""
    h = hashlib.sha256()
    for source in _generator_sources(name):
        h.update(source.read_bytes())
    for dist in ("torch", "transformers", "diffusers", "tokenizers", "safetensors"):
        try:
            h.update(f"{dist}={metadata.version(dist)}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none\n".encode())
    return h.hexdigest()[:16]


def _generator_sources(name: str) -> list[Path]:
    """This module, the tokenizer, the shared helpers (`tiny_common.py`, and the `tiny*.py`
    that families share under vllm_omni/models/) and the builder modules of the model's family
    (`tiny*.py` beside its builder's: a builder may use its siblings' parts)."""
    builder = Path(sys.modules[tiny_models()[name].build.__module__].__file__)
    family = sorted(builder.parent.glob("tiny*.py"))
    shared = sorted((Path(tiny_common.__file__).parents[1] / "models").glob("tiny*.py"))
    paths = [Path(tt.__file__), Path(tiny_common.__file__), *shared, *family]
    sources = [Path(__file__)]
    for path in paths:
        if path not in sources:
            sources.append(path)
    return sources


def is_complete(folder: Path, digest: str | None = None) -> bool:
    """Whether `folder` holds a finished tiny model (of `digest`: default, its own name's)."""
    marker = folder / MARKER
    return marker.is_file() and marker.read_text().strip() == (
        digest or generator_hash(folder.name)
    )


def build_tiny_models(
    out_dir: Path, names: Iterable[str] | None = None, *, verbose: bool = False
) -> dict[str, Path]:
    """Build the named tiny models (default: all) under `out_dir`; returns name -> folder.

    Idempotent and safe against concurrent callers: a model is built in a temporary sibling
    folder, its marker written last, and the folder renamed into place; a folder whose marker
    matches the current generator is reused as is.
    """
    out_dir = Path(out_dir)
    known = tiny_models()
    names = list(known) if names is None else list(names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"names: unknown tiny model(s) {unknown}; known: {list(known)}")
    paths: dict[str, Path] = {}
    for name in names:
        digest = generator_hash(name)
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
            known[name].build(tmp)
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


class TinyModels(Mapping[str, Path]):
    """The tiny models under `out_dir` by name, each built on first access."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self._built: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in tiny_models():
            raise KeyError(name)
        if name not in self._built:
            self._built[name] = build_tiny_models(self.out_dir, [name], verbose=True)[name]
        return self._built[name]

    def __contains__(self, name: object) -> bool:
        return name in tiny_models()

    def __iter__(self) -> Iterator[str]:
        return iter(tiny_models())

    def __len__(self) -> int:
        return len(tiny_models())


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_omni.testing.tiny",
        description="Generate tiny random-weight models (deterministic, no download).",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"output folder (default: ${ENV_DIR} or ~/.cache)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=list(tiny_models()), metavar="NAME",
        help=f"build only these models ({', '.join(tiny_models())})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else default_models_dir()
    for name, path in build_tiny_models(out, args.only, verbose=True).items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
