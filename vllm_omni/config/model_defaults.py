# SPDX-License-Identifier: Apache-2.0
"""Built-in stage graphs per model type, so `OmniLLM(model=DIR)` needs no YAML.

A model (a folder or a hub repo id, config/model_source.py) is recognised by its files: a
diffusers `model_index.json` naming `QwenImagePipeline` is Qwen-Image (text encoder on vLLM ->
DiT); a transformers `config.json` of model type `qwen2_5_omni` is Qwen2.5-Omni (thinker ->
talker -> code2wav); any other `config.json` is a plain language model (one AR stage).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vllm_omni.config.model_source import CONFIG_FILES, default_files, fetch_model, model_path
from vllm_omni.config.stage_config import StageGraph, apply_overrides


def qwen_image_graph() -> dict[str, Any]:
    """The DiT stage decodes its own latents. A separate `vae_decoder` stage is an option
    (docs/omni.md): on this 2-core machine it was no faster for the tiny model and slower for a
    compute-bound DiT, which then has fewer cores to itself."""
    return {
        "model_type": "qwen_image",
        "stages": [
            {
                "name": "text_encoder",
                "engine_type": "AR",
                "model": "text_encoder",
                "tokenizer": "tokenizer",
                "processor": "qwen_image_prompt",
                "input_modalities": ["text"],
                "output_modalities": ["embeddings"],
            },
            {
                "name": "dit",
                "engine_type": "DiT",
                "model": ".",
                "inputs": {
                    "prompt_embeds": "text_encoder.prompt_embeds",
                    "negative_prompt_embeds": "text_encoder.negative_prompt_embeds",
                },
                "input_modalities": ["embeddings"],
                "output_modalities": ["image"],
                "scheduler": "step",
                "final_output": True,
            },
        ],
    }


def qwen25_omni_graph() -> dict[str, Any]:
    """Thinker (text; hands on its per-token hidden states) -> talker (speech-codec tokens) ->
    code2wav (waveform). Both the thinker's text and the waveform are final outputs; a request
    that asks for text only runs the thinker alone. A streamed request starts the talker with
    the thinker and code2wav with the talker (`stream_input`)."""
    return {
        "model_type": "qwen2_5_omni",
        "stages": [
            {
                "name": "thinker",
                "engine_type": "AR",
                "model": ".",
                "processor": "qwen25_omni_thinker",
                "input_modalities": ["text"],
                "output_modalities": ["text"],
                "final_output": True,
            },
            {
                "name": "talker",
                "engine_type": "AR",
                "model": ".",
                "processor": "qwen25_omni_talker",
                "inputs": {
                    "thinker_states": "thinker.thinker_states",
                    "prompt_token_ids": "thinker.prompt_token_ids",
                },
                "input_modalities": ["embeddings"],
                "output_modalities": ["codec"],
                "stream_input": True,
            },
            {
                "name": "code2wav",
                "engine_type": "DiT",
                "model": ".",
                "executor": "code2wav",
                "inputs": {"codec_tokens": "talker.codec_tokens"},
                "input_modalities": ["codec"],
                "output_modalities": ["audio"],
                "stream_input": True,
                "final_output": True,
            },
        ],
    }


def language_model_graph() -> dict[str, Any]:
    return {
        "model_type": "lm",
        "stages": [{"name": "lm", "engine_type": "AR", "model": ".", "final_output": True}],
    }


MODEL_GRAPHS: dict[str, Callable[[], dict[str, Any]]] = {
    "qwen_image": qwen_image_graph,
    "qwen2_5_omni": qwen25_omni_graph,
    "lm": language_model_graph,
}
PIPELINE_CLASSES = {"QwenImagePipeline": "qwen_image"}
CONFIG_MODEL_TYPES = ("qwen2_5_omni",)  # transformers model types with a graph of their own
EXTRA_FILES = {"qwen2_5_omni": ("spk_dict.pt",)}  # beyond a transformers checkpoint's own


def detect_model_type(model: str | Path, name: str | None = None) -> str:
    """The model type of a folder, from its `model_index.json` or `config.json`. `name`: what
    the user typed, for errors (default: the folder)."""
    folder = Path(model)
    name = name or str(folder)
    index = folder / "model_index.json"
    if index.is_file():
        pipeline = json.loads(index.read_text()).get("_class_name")
        if pipeline in PIPELINE_CLASSES:
            return PIPELINE_CLASSES[pipeline]
        raise ValueError(
            f"model: {name!r} is a diffusers pipeline of class {pipeline!r}, which has no "
            f"built-in stage graph (known: {sorted(PIPELINE_CLASSES)}); pass a stage graph "
            "YAML with --stage-configs"
        )
    if (folder / "config.json").is_file():
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        return model_type if model_type in CONFIG_MODEL_TYPES else "lm"
    found = sorted(p.name for p in folder.iterdir())[:10] if folder.is_dir() else []
    raise ValueError(
        f"model: {name!r} has neither model_index.json (a diffusers pipeline) nor config.json "
        f"(a transformers model); found: {found or 'no files'}"
    )


def model_files(folder: Path, model: str) -> list[str]:
    """The hub files `model`'s built-in graph loads, judged from its config files in `folder`."""
    patterns = default_files(folder)
    if not (folder / "model_index.json").is_file():
        patterns += EXTRA_FILES.get(detect_model_type(folder, model), ())
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
        values = MODEL_GRAPHS[detect_model_type(base, str(model))]()
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
