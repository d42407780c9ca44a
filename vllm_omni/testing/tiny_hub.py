# SPDX-License-Identifier: Apache-2.0
"""The tiny models laid out as a Hugging Face hub cache, under the real repos' names.

A user types `Qwen/Qwen-Image`; huggingface_hub finds it in its cache (`HF_HUB_CACHE`) as
`models--Qwen--Qwen-Image/{refs/main, snapshots/<commit>/..., blobs/<hash>}`, each snapshot file
a relative link to its blob. This writes the tiny models in that layout, so that tests and the
demo take the path a real checkpoint takes (`HF_HUB_OFFLINE=1`, no download):

    python -m vllm_omni.testing.tiny_hub --cache DIR
    HF_HUB_CACHE=DIR HF_HUB_OFFLINE=1 vllm serve Qwen/Qwen-Image --omni
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

from vllm_omni.registry import tiny_models
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir


def hub_names() -> dict[str, str]:
    """Real repo id -> the tiny model of the same architecture stored under it (what the
    families declare: `TinyModel.repos`)."""
    return {repo: name for name, model in tiny_models().items() for repo in model.repos}


def repo_folder(cache: Path, repo_id: str) -> Path:
    """huggingface_hub's folder for a model repo in `cache`."""
    return Path(cache) / ("models--" + repo_id.replace("/", "--"))


def _files(folder: Path) -> list[Path]:
    """A model folder's files, relative, without the tiny builder's hidden marker."""
    return sorted(
        p.relative_to(folder)
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def store_snapshot(cache: Path, repo_id: str, folder: Path) -> Path:
    """Store `folder` as the `main` revision of `repo_id` in `cache`; returns the snapshot.
    The commit is a hash of the files, so storing the same bytes twice is a no-op."""
    files = {rel: _digest(folder / rel) for rel in _files(folder)}
    commit = hashlib.sha1("".join(f"{rel}\0{d}\n" for rel, d in files.items()).encode()).hexdigest()
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        tmp = snapshot.with_name(f".{commit}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for rel, digest in files.items():
            blob = repo / "blobs" / digest
            if not blob.exists():
                blob.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / rel, blob)
            link = tmp / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, snapshot / rel.parent))
        try:
            tmp.rename(snapshot)
        except OSError:  # another process stored the same commit first
            shutil.rmtree(tmp, ignore_errors=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def build_hub_cache(cache: Path, repo_ids: list[str] | None = None) -> dict[str, Path]:
    """Build the tiny models (if needed) and store them in `cache` under their real names;
    returns repo id -> snapshot folder."""
    names = hub_names()
    repo_ids = list(names) if repo_ids is None else repo_ids
    unknown = [r for r in repo_ids if r not in names]
    if unknown:
        raise ValueError(f"repo_ids: no tiny model for {unknown}; known: {list(names)}")
    tiny = build_tiny_models(default_models_dir(), sorted({names[r] for r in repo_ids}))
    return {r: store_snapshot(Path(cache), r, tiny[names[r]]) for r in repo_ids}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_omni.testing.tiny_hub",
        description="Store the tiny models in a Hugging Face hub cache under the real repo names.",
    )
    parser.add_argument("--cache", type=Path, required=True, help="the cache (HF_HUB_CACHE)")
    args = parser.parse_args(argv)
    for repo_id, snapshot in build_hub_cache(args.cache).items():
        print(f"{repo_id}\t{snapshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
