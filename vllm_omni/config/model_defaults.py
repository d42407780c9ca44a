# SPDX-License-Identifier: Apache-2.0
"""Built-in stage graphs per model type, so `OmniLLM(model=DIR)` needs no YAML.

A model folder is recognised by its files: a diffusers `model_index.json` naming
`QwenImagePipeline` is Qwen-Image (text encoder on vLLM -> DiT); a transformers `config.json`
of model type `qwen2_5_omni` is Qwen2.5-Omni (thinker -> talker -> code2wav); any other
`config.json` is a plain language model (one AR stage).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

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


def detect_model_type(model: str | Path) -> str:
    folder = Path(model)
    index = folder / "model_index.json"
    if index.is_file():
        pipeline = json.loads(index.read_text()).get("_class_name")
        if pipeline in PIPELINE_CLASSES:
            return PIPELINE_CLASSES[pipeline]
        raise ValueError(
            f"model: diffusers pipeline {pipeline!r} has no built-in stage graph (known: "
            f"{sorted(PIPELINE_CLASSES)}); pass a stage graph YAML with --stage-configs"
        )
    if (folder / "config.json").is_file():
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        return model_type if model_type in CONFIG_MODEL_TYPES else "lm"
    raise ValueError(f"model: {str(folder)!r} has neither model_index.json nor config.json")


def resolve_stage_graph(
    model: str | Path | None = None,
    stage_configs: str | Path | StageGraph | Mapping | None = None,
    stage_overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> StageGraph:
    """The stage graph for a model: an explicit graph (YAML path, dict or StageGraph), else the
    built-in one for the model's type. Relative model paths resolve against `model`."""
    if isinstance(stage_configs, StageGraph):
        if stage_overrides:
            raise ValueError("stage_overrides: not applicable to a ready-made StageGraph")
        return stage_configs
    base = Path(model).expanduser() if model is not None else None
    if stage_configs is None:
        if base is None:
            raise ValueError("model: required when no stage graph is given")
        values = MODEL_GRAPHS[detect_model_type(base)]()
    elif isinstance(stage_configs, Mapping):
        values = dict(stage_configs)
    else:
        import yaml

        path = Path(stage_configs)
        values = yaml.safe_load(path.read_text())
        base = base or path.parent
    if stage_overrides:
        values = apply_overrides(values, stage_overrides)
    return StageGraph.from_dict(values, base)
