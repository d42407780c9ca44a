# SPDX-License-Identifier: Apache-2.0
"""A model's stage graph, so `OmniLLM(model)` needs no YAML.

A model (a folder or a hub repo id, config/model_source.py) is recognised by its config files,
and its family (vllm_omni.registry) gives the built-in graph: e.g. a diffusers
`model_index.json` naming `QwenImagePipeline` is Qwen-Image (text encoder on vLLM -> DiT), a
transformers `config.json` of model type `qwen2_5_omni` is Qwen2.5-Omni (thinker -> talker ->
code2wav), any other `config.json` a plain language model (one AR stage).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_omni.config.model_source import CONFIG_FILES, default_files, fetch_model, model_path
from vllm_omni.config.stage_config import StageGraph, apply_overrides
from vllm_omni.registry import detect_family


def detect_model_type(model: str | Path, name: str | None = None) -> str:
    """The family name of the checkpoint in folder `model` (vllm_omni.registry).
    `name`: what the user typed, for errors (default: the folder)."""
    return detect_family(model, name).name


def model_files(folder: Path, model: str) -> list[str]:
    """The hub files `model`'s built-in graph loads, judged from its config files in `folder`."""
    patterns = default_files(folder)
    if not (folder / "model_index.json").is_file():
        patterns += detect_family(folder, model).extra_files
    return patterns


def inspect_model(
    model: str | Path, *, revision: str | None = None, download_dir: str | Path | None = None
) -> str:
    """The model type of a folder or hub repo, from its config files alone (a hub repo's
    weights are not fetched)."""
    folder = model_path(
        model, revision=revision, download_dir=download_dir, allow_patterns=CONFIG_FILES
    )
    return detect_model_type(folder, str(model))


def resolve_stage_graph(
    model: str | Path | None = None,
    stage_configs: str | Path | StageGraph | Mapping | None = None,
    stage_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    revision: str | None = None,
    download_dir: str | Path | None = None,
) -> StageGraph:
    """The stage graph for a model: an explicit graph (YAML path, dict or StageGraph), else the
    built-in one for the model's type. `model` is a folder or a hub repo id (fetched or found in
    the cache with `revision` and `download_dir`, model_source.py); relative model paths in the
    graph resolve against its folder, and a stage's `model` may be a hub id too."""
    if isinstance(stage_configs, StageGraph):
        if stage_overrides:
            raise ValueError("stage_overrides: not applicable to a ready-made StageGraph")
        return stage_configs

    def locate(name: str | Path) -> Path:
        return fetch_model(
            name, revision=revision, download_dir=download_dir, files_for=model_files
        )

    base = locate(model) if model is not None else None
    if stage_configs is None:
        if base is None:
            raise ValueError("model: required when no stage graph is given")
        values = detect_family(base, str(model)).graph()
    elif isinstance(stage_configs, Mapping):
        values = dict(stage_configs)
    else:
        import yaml

        path = Path(stage_configs)
        values = yaml.safe_load(path.read_text())
        base = base or path.parent
    if stage_overrides:
        values = apply_overrides(values, stage_overrides)
    return StageGraph.from_dict(values, base, locate)
