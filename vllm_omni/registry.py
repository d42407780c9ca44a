# SPDX-License-Identifier: Apache-2.0
"""The model families: one folder each under vllm_omni/models/, found through this registry.

A family says how a model is recognised (a diffusers pipeline class in `model_index.json`, or a
transformers model type in `config.json`), its built-in stage graph, the files beyond a
checkpoint's usual ones that the graph loads, and how its checkpoint splits into stages; and it
brings what its stages run, by registered name: AR-stage processors (`processor:`), process-stage
executors (`executor:`), worker hooks, vLLM model classes, the HTTP routes of its outputs, and
the fingerprints of the library internals it relies on. The engine, the stage loop and the
server name no model; they ask the registry.

    from vllm_omni.registry import detect_family
    detect_family(folder).graph()        # the built-in stage graph, as a dict

Families are imported on first use (`families()`), so importing the registry costs nothing (it
imports no other module of the package). Adding one is a new folder with a `FAMILY` and its name
in `FAMILY_PACKAGES` (docs/adding_a_model.md).
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_omni.diffusion.executor_kind import ExecutorKind

FAMILY_PACKAGES = (
    "qwen_image",
    "qwen_image.edit",
    "qwen_image.edit_plus",
    "z_image",
    "wan",
    "aura_flow",
    "qwen2_5_omni",
    "qwen3_omni",
    "plain_lm",
    "diffusers_pipeline",
    "diffusers_pipeline.video",
    "diffusers_pipeline.audio",
)
"""Modules under vllm_omni/models/ that export a family's `FAMILY`: a family's folder, or a
package or module inside it where one folder holds related families (Qwen-Image's edits)."""
PLAIN_LM = "lm"
"""The family of any transformers model no other family claims: one AR stage."""
ANY_PIPELINE = "diffusers_pipeline"
"""The family of any diffusers image pipeline no other family claims: its own `__call__` per
request, step-batched, where it can be served (the families with `serves_pipeline` set, this one
first, are tried in turn)."""


@dataclass(frozen=True)
class TinyModel:
    """A tiny random-weight checkpoint of a family's real architecture, for tests, benchmarks
    and the demo (vllm_omni.testing)."""

    build: Callable[[Path], None]
    """Writes the checkpoint into an empty folder, the same bytes every time."""
    repos: tuple[str, ...] = ()
    """Real repo ids it is stored under in the tiny hub cache (vllm_omni.testing.tiny_hub)."""


@dataclass(frozen=True)
class ModelFamily:
    name: str
    """Registered name; a stage graph's `model_type`."""
    graph: Callable[[], dict[str, Any]]
    """The built-in stage graph (stage `model` paths relative to the checkpoint)."""
    pipeline_classes: tuple[str, ...] = ()
    """diffusers `model_index.json` `_class_name`s this family serves."""
    model_types: tuple[str, ...] = ()
    """transformers `config.json` `model_type`s this family serves."""
    extra_files: tuple[str, ...] = ()
    """Files the graph loads beyond a transformers checkpoint's configs, weights, tokenizer and
    templates (fetched from the hub with them)."""
    split_stages: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """For one checkpoint run as several stages: stage -> (transformers class, attribute of the
    checkpoint's config that configures it). Used by the memory plan."""
    repos: tuple[str, ...] = ()
    """Hugging Face repos of the released checkpoints (documentation)."""
    words: tuple[str, ...] = ()
    """The model's names as its code spells them (lower case, e.g. `wan`, `talker`): code
    outside vllm_omni/models/ never uses them (tests/test_layering.py). Empty only for the
    families that serve any model of a kind (plain LMs, any diffusers pipeline)."""
    processors: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    """AR-stage processors by registered name: StageConfig -> StageProcessor
    (vllm_omni.engine.ar_processor)."""
    executors: tuple[ExecutorKind, ...] = ()
    """Process-stage executors (each registered under its `name`)."""
    worker_hooks: Mapping[str, Callable[[], type]] = field(default_factory=dict)
    """vLLM worker hooks by registered name: () -> the hook class (vllm_omni.worker.hooks)."""
    vllm_models: Mapping[str, str] = field(default_factory=dict)
    """Architectures this family adds to vLLM: name -> "module:Class" (vLLM's lazy
    ModelRegistry form: the module is imported only where an engine builds the model)."""
    api: Callable[..., None] | None = None
    """Adds the HTTP routes of this family's outputs to the omni server (None: the server's
    routes for the graph's output modalities)."""
    pinned: Callable[[], list] | None = None
    """() -> the fingerprints (vllm_omni._patches.Pinned) of library internals this family's
    code relies on; tests/test_patches.py checks them."""
    tiny_models: Mapping[str, TinyModel] = field(default_factory=dict)
    """Its tiny models by name (`qwen-image`, `wan2.1-t2v`, ...)."""
    serves_pipeline: Callable[[str], None] | None = None
    """For a family of pipelines no other family claims (images, videos): raises ValueError
    saying why it cannot serve a diffusers pipeline class (the reason reads after "of class X,
    which")."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"name: must be an identifier, got {self.name!r}")
        if not callable(self.graph):
            raise ValueError(f"{self.name}.graph: must be callable")


@functools.cache
def families() -> dict[str, ModelFamily]:
    """Every registered family, by name (imported on the first call)."""
    found: dict[str, ModelFamily] = {}
    for package in FAMILY_PACKAGES:
        family = importlib.import_module(f"vllm_omni.models.{package}").FAMILY
        if family.name in found:
            raise ValueError(f"{package}: family name {family.name!r} is registered twice")
        found[family.name] = family
    return found


def _by_name(what: str, entries: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, entry in entries:
        if name in found:
            raise ValueError(f"{what} {name!r} is registered by two families")
        found[name] = entry
    return found


@functools.cache
def processors() -> dict[str, Callable[[Any], Any]]:
    """Every family's AR-stage processor factories, by registered name."""
    return _by_name("processor", [e for f in families().values() for e in f.processors.items()])


@functools.cache
def executor_kinds() -> dict[str, ExecutorKind]:
    """Every family's process-stage executors, by registered name."""
    return _by_name("executor", [(k.name, k) for f in families().values() for k in f.executors])


def executor_kind(name: str) -> ExecutorKind:
    try:
        return executor_kinds()[name]
    except KeyError:
        raise ValueError(
            f"executor: unknown process-stage executor {name!r}; known: {sorted(executor_kinds())}"
        ) from None


@functools.cache
def tiny_models() -> dict[str, TinyModel]:
    """Every family's tiny models, by name."""
    return _by_name("tiny model", [e for f in families().values() for e in f.tiny_models.items()])


@functools.cache
def worker_hooks() -> dict[str, Callable[[], type]]:
    """Every family's worker hooks, by registered name."""
    return _by_name("worker hook", [e for f in families().values() for e in f.worker_hooks.items()])


def get_family(name: str) -> ModelFamily:
    try:
        return families()[name]
    except KeyError:
        raise ValueError(
            f"model_type: unknown family {name!r}; known: {sorted(families())}"
        ) from None


def detect_family(folder: str | Path, name: str | None = None) -> ModelFamily:
    """The family of the checkpoint in `folder`, from its `model_index.json` or `config.json`.
    `name`: what the user typed, for errors (default: the folder)."""
    folder = Path(folder)
    name = name or str(folder)
    index = folder / "model_index.json"
    if index.is_file():
        pipeline = json.loads(index.read_text()).get("_class_name")
        for family in families().values():
            if pipeline in family.pipeline_classes:
                return family
        reasons = []
        for fallback in families().values():
            if fallback.serves_pipeline is None:
                continue
            try:
                fallback.serves_pipeline(pipeline)
                return fallback
            except ValueError as e:
                reasons.append(str(e))
        known = sorted(c for f in families().values() for c in f.pipeline_classes)
        raise ValueError(
            f"model: {name!r} is a diffusers pipeline of class {pipeline!r}, which "
            f"{', and '.join(dict.fromkeys(reasons))}; no built-in stage graph serves it (built "
            f"in: {known}, text-to-image, text-to-video and text-to-audio pipelines); pass a stage "
            "graph YAML with --stage-configs"
        )
    if (folder / "config.json").is_file():
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        for family in families().values():
            if model_type in family.model_types:
                return family
        return get_family(PLAIN_LM)
    found = sorted(p.name for p in folder.iterdir())[:10] if folder.is_dir() else []
    raise ValueError(
        f"model: {name!r} has neither model_index.json (a diffusers pipeline) nor config.json "
        f"(a transformers model); found: {found or 'no files'}"
    )
