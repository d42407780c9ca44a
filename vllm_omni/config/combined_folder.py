# SPDX-License-Identifier: Apache-2.0
"""One folder vLLM can load from a model split across a diffusers pipeline's folders.

vLLM reads a multimodal model's processor (image sizes, normalisation, the tokenizer it wraps)
from the model's own folder; a diffusers pipeline keeps it in a folder of its own (Qwen-Image-
Edit: `text_encoder/` and `processor/`). The combined folder links both folders' files side by
side, so the engine loads the checkpoint's own files, and costs no copy.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from vllm_omni.platform.cache_dir import cache_root


def combined_dir() -> Path:
    return cache_root() / "combined"


def model_with_processor(model: str, processor: str) -> str:
    """A folder holding links to `model`'s files and `processor`'s (the model's win where both
    have a file of one name). Keyed by the two folders' real paths, and rebuilt when their file
    lists change."""
    model_dir, processor_dir = Path(model).resolve(), Path(processor).resolve()
    for field, folder in (("model", model_dir), ("hf_processor", processor_dir)):
        if not folder.is_dir():
            raise ValueError(f"{field}: {folder} is not a folder")
    files = {p.name: p for p in sorted(processor_dir.iterdir()) if p.is_file()}
    files.update({p.name: p for p in sorted(model_dir.iterdir()) if p.is_file()})
    ident = "\n".join(f"{name}\t{path.resolve()}" for name, path in sorted(files.items()))
    target = combined_dir() / hashlib.sha256(ident.encode()).hexdigest()[:16]
    if not target.is_dir():
        staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        staging.mkdir(parents=True, exist_ok=True)
        for name, path in files.items():
            link = staging / name
            if not link.is_symlink():
                link.symlink_to(path.resolve())
        try:
            staging.rename(target)  # atomic: another process may have made it meanwhile
        except OSError:
            for link in staging.iterdir():
                link.unlink()
            staging.rmdir()
    return str(target)
