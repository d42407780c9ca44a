# SPDX-License-Identifier: Apache-2.0
"""Model names as users type them: a local folder, or a Hugging Face hub repo id.

A repo id resolves through huggingface_hub the way vLLM resolves one: its cache (`HF_HOME`,
`HF_HUB_CACHE`, or `download_dir`), `HF_HUB_OFFLINE`, a revision, and the token from the
environment (`HF_TOKEN` or `hf auth login`). Online, only the files asked for are fetched
(`allow_patterns`), with huggingface_hub's own progress bars; offline, the cached snapshot is used.
Every failure becomes a ValueError that names the model and the cause, before any stage starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

CONFIG_FILES = ("model_index.json", "config.json")
"""What tells a model's family: a diffusers pipeline's index, or a transformers config."""

WEIGHT_FORMATS_SKIPPED = ("*.msgpack", "*.h5", "*.onnx", "*.onnx_data", "*.ot", "*.gguf")
"""Flax, TensorFlow, ONNX, Rust and GGUF copies that some repos carry beside their PyTorch
weights; nothing here loads them."""


def is_local(model: str | Path) -> bool:
    return Path(model).expanduser().exists()


def is_repo_id(name: str) -> bool:
    """`owner/name` (or `name`) as huggingface_hub validates repo ids."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(name, str) or name.startswith(("/", ".", "~")):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def model_path(
    model: str | Path,
    *,
    revision: str | None = None,
    download_dir: str | Path | None = None,
    allow_patterns: Sequence[str] | None = None,
) -> Path:
    """The local folder holding `model`'s files: the folder itself, or the hub snapshot with
    (at least) the files matching `allow_patterns` (all files if None)."""
    if is_local(model):
        path = Path(model).expanduser()
        if not path.is_dir():
            raise ValueError(f"model: {str(model)!r} is a file; a model is a folder or a hub id")
        return path
    name = str(model)
    if not is_repo_id(name):
        raise ValueError(
            f"model: {name!r} is neither a local folder nor a Hugging Face repo id (owner/name)"
        )
    return _snapshot(name, revision, download_dir, allow_patterns)


def _snapshot(
    repo_id: str,
    revision: str | None,
    download_dir: str | Path | None,
    allow_patterns: Sequence[str] | None,
) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"model: {repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    cache = Path(download_dir or constants.HF_HUB_CACHE).expanduser()
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=str(cache) if download_dir else None,
            allow_patterns=list(allow_patterns) if allow_patterns is not None else None,
            ignore_patterns=list(WEIGHT_FORMATS_SKIPPED),
        )
    except GatedRepoError:
        raise ValueError(
            f"{where}: the repo is gated; accept its terms on huggingface.co and set HF_TOKEN "
            "(or run `hf auth login`)"
        ) from None
    except RevisionNotFoundError:
        raise ValueError(f"{where}: the revision does not exist in the repo") from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"{where}: no such repo on the Hugging Face hub (or it is private and no token "
            "with access is set: HF_TOKEN)"
        ) from None
    except IncompleteSnapshotError as e:
        raise ValueError(f"{where}: the cached copy in {cache} is incomplete: {e}") from None
    except LocalEntryNotFoundError:
        offline = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub is unreachable"
        raise ValueError(
            f"{where}: not in the Hugging Face cache ({cache}) and {offline}; download it "
            "first (`hf download`) or point HF_HUB_CACHE / --download-dir at a cache that holds it"
        ) from None
    except HfHubHTTPError as e:
        raise ValueError(f"{where}: the hub answered {e}") from None
    return Path(path)


def fetch_model(
    model: str | Path,
    *,
    revision: str | None = None,
    download_dir: str | Path | None = None,
    files_for: Callable[[Path, str], Sequence[str]] | None = None,
) -> Path:
    """The folder with every file `model` needs: a local folder as it is; a hub repo in two
    steps, its config files first, then what `files_for(folder with the config files, model)`
    names (default: `default_files`)."""
    if is_local(model):
        return model_path(model)
    configs = model_path(
        model, revision=revision, download_dir=download_dir, allow_patterns=CONFIG_FILES
    )
    patterns = (files_for or default_files)(configs, str(model))
    return model_path(model, revision=revision, download_dir=download_dir, allow_patterns=patterns)


def default_files(folder: Path, model: str | None = None) -> list[str]:
    """A diffusers pipeline's components, else a transformers checkpoint's files."""
    index = folder / "model_index.json"
    if index.is_file():
        return diffusers_patterns(json.loads(index.read_text()))
    return list(TRANSFORMERS_PATTERNS)


def diffusers_patterns(index: dict) -> list[str]:
    """The files a diffusers pipeline loads: its index and the folder of every component the
    index names (a `[library, class]` pair; `[null, null]` marks an absent optional one)."""
    patterns = ["model_index.json"]
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        if value[0] is not None and value[1] is not None:
            patterns.append(f"{name}/*")
    return patterns


TRANSFORMERS_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.txt",
    "*.model",
    "*.tiktoken",
    "*.jinja",
)
"""What a transformers checkpoint loads: configs, weights, tokenizer and processor files, chat
templates. A family adds the files of its own (model_defaults.py)."""
