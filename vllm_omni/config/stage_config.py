# SPDX-License-Identifier: Apache-2.0
"""StageConfig and StageGraph: a model as a DAG of stages, each on its own engine.

A stage names its engine type (`AR`: a vLLM engine; `DiT`: a diffusion engine), its model
folder, and scheduler/executor/processor by registered name - never by import string. Edges
carry named tensors: `inputs: {prompt_embeds: text_encoder.prompt_embeds}` feeds the tensor
`prompt_embeds` of stage `text_encoder` into this stage under the same name. A stage runs for
a request once all its source stages have finished it (fan-in); a stage's outputs can feed
any number of stages (fan-out). Stages without inputs receive the request's prompt.

The YAML file format is this structure (docs/stage_graphs.md; each field in
docs/configuration.md); every field is validated on load and errors name the field, e.g.
`stages[1].dit.max_num_seqs: must be an integer >= 1`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from vllm_omni import registry
from vllm_omni.config.model_source import fetch_model, is_repo_id
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.scheduler import SCHEDULING_MODES

Locate = Callable[[str], Path]

ENGINE_TYPES = ("AR", "DiT")
# Registered names, per engine type (process-stage executors and AR processors: the model
# families', vllm_omni.registry).
SCHEDULERS = {"AR": ("default", "cpp"), "DiT": SCHEDULING_MODES}
AR_EXECUTORS = ("auto", "mp", "uni", "ray")
DEFAULT_SCHEDULER = {"AR": "default", "DiT": "step"}
BACKENDS = ("local", "ray")
DEFAULT_AR_EXECUTOR = "auto"


def executors(engine_type: str) -> tuple[str, ...]:
    return AR_EXECUTORS if engine_type == "AR" else tuple(registry.executor_kinds())


def _whole_requests(executor: str) -> bool:
    kind = registry.executor_kinds().get(executor)
    return kind is not None and kind.whole_requests


@dataclass(frozen=True)
class StageConfig:
    name: str
    """The stage's name (an identifier): edges and per-stage parameters refer to it."""
    engine_type: str
    """`AR`: a vLLM engine; `DiT`: a process stage of its own (a diffusion transformer, a VAE
    decoder, a vocoder), run by a registered executor."""
    model: str
    """The stage's model: a folder (relative to the graph's file or the checkpoint) or a hub repo
    id (`owner/name`)."""
    input_modalities: tuple[str, ...] = ("text",)
    """What the stage takes (documentation of the graph; e.g. `text`, `embeddings`, `codec`)."""
    output_modalities: tuple[str, ...] = ("text",)
    """What the stage makes; a final stage's are the graph's outputs (`text`, `image`, `audio`),
    which decide the server's routes and what a request's `modalities` may ask for."""
    inputs: Mapping[str, str] = field(default_factory=dict)
    """Edges: `{name: source_stage.tensor}`; a stage without inputs receives the prompt."""
    processor: str | None = None
    """AR stages: a registered processor (a model family's) that builds the engine's prompts and
    the stage's outputs; none: the stage generates text."""
    tokenizer: str | None = None
    """AR stages: the tokenizer's folder, where the model's folder holds none."""
    hf_processor: str | None = None
    """AR stages: the folder of a multimodal model's processor (its image sizes and
    normalisation), where the model's folder holds none (a diffusers pipeline's `processor`)."""
    scheduler: str | None = None
    """AR: `default` (vLLM's) or `cpp`; DiT: `step` (requests join and leave between denoising
    steps) or `fifo` (whole requests). Default: `default`, or `step` (`fifo` for executors that
    run whole requests)."""
    executor: str | None = None
    """AR: vLLM's distributed executor backend (`auto`, `mp`, `uni`, `ray`; default `auto`);
    DiT: a registered executor (`qwen_image`, `wan`, `vae_decoder`, `code2wav`, ...), required."""
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    """AR stages: vLLM engine arguments (`dtype`, `max_model_len`, ...; `cpp` for CPP's
    settings)."""
    dit: Mapping[str, Any] = field(default_factory=dict)
    """DiT stages: the stage process's settings (below)."""
    max_inflight: int = 64
    """Requests the stage holds at once; the rest wait in the orchestrator (back-pressure)."""
    final_output: bool = False
    """The stage's outputs are the request's (default: the stages nothing reads from)."""
    stream_input: bool = False
    """Start as soon as the (single) source starts, reading its partial outputs as they come
    (`inputs["upstream"]`, see vllm_omni.engine.stage_stream), instead of after it finishes."""
    backend: str = "local"
    """Where the stage computes: `local` (processes on this machine) or `ray` (the stage in a Ray
    actor placed by `resources`: a DiT stage's loop, or an AR stage's whole vLLM engine with its
    processor; `executor: ray` also puts an AR stage's workers on Ray). docs/distributed.md."""
    resources: Mapping[str, float] = field(default_factory=lambda: {"CPU": 1})
    """Ray resources a stage's actor needs ("CPU", "GPU" or custom names): they choose its node.
    Only with `backend: ray`."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: must be an identifier, got {self.name!r}")
        if self.engine_type not in ENGINE_TYPES:
            raise ValueError(
                f"engine_type: must be one of {ENGINE_TYPES}, got {self.engine_type!r}"
            )
        if self.executor is None and self.engine_type == "AR":
            object.__setattr__(self, "executor", DEFAULT_AR_EXECUTOR)
        if self.executor is None:
            raise ValueError(
                f"executor: a process stage names what it runs, one of "
                f"{executors(self.engine_type)}"
            )
        if self.executor not in executors(self.engine_type):
            raise ValueError(
                f"executor: {self.engine_type} stages take one of "
                f"{executors(self.engine_type)}, got {self.executor!r}"
            )
        whole_requests = self.engine_type == "DiT" and _whole_requests(self.executor)
        if self.scheduler is None:
            default = "fifo" if whole_requests else DEFAULT_SCHEDULER[self.engine_type]
            object.__setattr__(self, "scheduler", default)
        if self.scheduler not in SCHEDULERS[self.engine_type]:
            raise ValueError(
                f"scheduler: {self.engine_type} stages take one of "
                f"{SCHEDULERS[self.engine_type]}, got {self.scheduler!r}"
            )
        if whole_requests and self.scheduler != "fifo":
            raise ValueError(
                f"scheduler: the {self.executor} executor runs whole requests; use 'fifo'"
            )
        if self.processor is not None and self.processor not in registry.processors():
            known = tuple(registry.processors())
            raise ValueError(f"processor: must be one of {known}, got {self.processor!r}")
        for key, source in self.inputs.items():
            if not isinstance(source, str) or source.count(".") != 1:
                raise ValueError(f"inputs.{key}: must be 'stage.tensor', got {source!r}")
        if self.stream_input and len(self.sources) != 1:
            raise ValueError(
                f"stream_input: a streaming stage reads exactly one source, got {self.sources}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: must be one of {BACKENDS}, got {self.backend!r}")
        for key, amount in self.resources.items():
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
                raise ValueError(f"resources.{key}: must be a number >= 0, got {amount!r}")
        if not isinstance(self.max_inflight, int) or self.max_inflight < 1:
            raise ValueError(f"max_inflight: must be an integer >= 1, got {self.max_inflight!r}")
        if self.engine_type == "DiT":
            dit = self.dit_config()  # validate now, not when the stage starts
            if dit.scheduling_policy == "deadline" and self.scheduler != "step":
                raise ValueError(
                    f"dit.scheduling_policy: 'deadline' needs the 'step' scheduler, "
                    f"this stage has {self.scheduler!r}"
                )
            if dit.admission_control and dit.scheduling_policy != "deadline":
                raise ValueError("dit.admission_control: needs scheduling_policy 'deadline'")
            cache = dit.residual_cache
            if cache is not None and cache.enabled:
                self._check_residual_cache()
        elif self.dit:
            raise ValueError("dit: only DiT stages take DiT settings")
        if self.engine_type == "DiT" and self.engine_args:
            raise ValueError("engine_args: DiT stages take their settings under 'dit'")

    def _check_residual_cache(self) -> None:
        kind = registry.executor_kind(self.executor)
        if not kind.residual_cache or self.scheduler != "step":
            able = sorted(n for n, k in registry.executor_kinds().items() if k.residual_cache)
            raise ValueError(
                f"dit.residual_cache: residual caching runs in an executor that supports it "
                f"({able}) with the 'step' scheduler; this stage has {self.executor!r} / "
                f"{self.scheduler!r}"
            )

    @property
    def sources(self) -> list[str]:
        return sorted({source.split(".")[0] for source in self.inputs.values()})

    def dit_config(self) -> DiTConfig:
        return DiTConfig.from_dict({"model": self.model, **self.dit}, where="dit")

    @classmethod
    def from_dict(
        cls,
        values: Mapping[str, Any],
        base_dir: Path | None = None,
        locate: Locate | None = None,
    ) -> StageConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field; known: {sorted(known)}")
        for required in ("name", "engine_type", "model"):
            if required not in values:
                raise ValueError(f"{required}: required")
        values = dict(values)
        for key in ("model", "tokenizer", "hf_processor"):
            if values.get(key) is not None:
                values[key] = _resolve_path(key, values[key], base_dir, locate)
        for key in ("input_modalities", "output_modalities"):
            if key in values:
                values[key] = tuple(values[key])
        for key in ("inputs", "engine_args", "dit", "resources"):
            if key in values and not isinstance(values[key], Mapping):
                raise ValueError(f"{key}: must be a mapping, got {type(values[key]).__name__}")
        return cls(**values)


@dataclass(frozen=True)
class StageGraph:
    stages: tuple[StageConfig, ...]
    """The stages (fields below)."""
    model_type: str | None = None
    """The model family the graph belongs to (a registered name): its API routes serve it."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("stages: at least one stage is required")
        names = [s.name for s in self.stages]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"stages[{i}].name: duplicate stage name {name!r}")
        for i, stage in enumerate(self.stages):
            for key, source in stage.inputs.items():
                src = source.split(".")[0]
                if src not in names:
                    raise ValueError(f"stages[{i}].inputs.{key}: unknown stage {src!r}")
                if src == stage.name:
                    raise ValueError(f"stages[{i}].inputs.{key}: a stage cannot feed itself")
        self.topological_order()  # raises on cycles

    def __getitem__(self, name: str) -> StageConfig:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def topological_order(self) -> list[StageConfig]:
        done: list[str] = []
        pending = list(self.stages)
        while pending:
            ready = [s for s in pending if all(src in done for src in s.sources)]
            if not ready:
                raise ValueError(f"stages: the graph has a cycle among {[s.name for s in pending]}")
            for s in ready:
                done.append(s.name)
                pending.remove(s)
        return [self[name] for name in done]

    @property
    def final_stages(self) -> list[StageConfig]:
        marked = [s for s in self.stages if s.final_output]
        if marked:
            return marked
        fed = {src for s in self.stages for src in s.sources}
        return [s for s in self.stages if s.name not in fed]

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """What the graph's final stages produce, e.g. ("text", "audio")."""
        out: list[str] = []
        for stage in self.final_stages:
            out += [m for m in stage.output_modalities if m not in out]
        return tuple(out)

    def stages_for(self, modalities: tuple[str, ...]) -> list[str]:
        """The stages a request that wants `modalities` runs: the final stages that produce one
        of them, and every stage they depend on (a text-only request to a model that
        writes and speaks runs its text stage alone)."""
        needed: set[str] = set()
        pending = [s.name for s in self.final_stages if set(s.output_modalities) & set(modalities)]
        while pending:
            name = pending.pop()
            if name not in needed:
                needed.add(name)
                pending += self[name].sources
        return [s.name for s in self.topological_order() if s.name in needed]

    @classmethod
    def from_dict(
        cls,
        values: Mapping[str, Any],
        base_dir: Path | None = None,
        locate: Locate | None = None,
    ) -> StageGraph:
        """`base_dir`: where relative model paths start; `locate(hub id) -> folder` finds a
        stage's model given as a hub repo id (default: model_source.fetch_model)."""
        if not isinstance(values, Mapping):
            raise ValueError("stage graph: must be a mapping with a 'stages' list")
        unknown = sorted(set(values) - {"stages", "model_type"})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field; known: ['model_type', 'stages']")
        raw = values.get("stages")
        if not isinstance(raw, list):
            raise ValueError("stages: must be a list")
        stages = []
        for i, stage in enumerate(raw):
            if not isinstance(stage, Mapping):
                raise ValueError(f"stages[{i}]: must be a mapping")
            try:
                stages.append(StageConfig.from_dict(stage, base_dir, locate))
            except (ValueError, TypeError) as e:
                raise ValueError(f"stages[{i}].{e}") from None
        return cls(stages=tuple(stages), model_type=values.get("model_type"))

    def to_dict(self) -> dict[str, Any]:
        """The graph in its YAML form (`from_dict` of it gives an equal graph)."""
        stages = [{f.name: getattr(s, f.name) for f in fields(StageConfig)} for s in self.stages]
        return {"model_type": self.model_type, "stages": stages}

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]] | None) -> StageGraph:
        """This graph with per-stage overrides ({stage name: {field: value}}) merged in."""
        if not overrides:
            return self
        return StageGraph.from_dict(apply_overrides(self.to_dict(), overrides))

    @classmethod
    def from_yaml(cls, path: str | Path, base_dir: str | Path | None = None) -> StageGraph:
        """Load a YAML stage graph; relative model paths resolve against `base_dir` (default:
        the YAML file's folder)."""
        path = Path(path)
        try:
            values = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML: {e}") from None
        return cls.from_dict(values, Path(base_dir) if base_dir else path.parent)


def apply_overrides(
    values: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, Any]:
    """Deep-merge per-stage overrides ({stage name: {field: value}}) into a graph dict."""
    values = {**values, "stages": [dict(s) for s in values["stages"]]}
    by_name = {s.get("name"): s for s in values["stages"]}
    for name, fields_ in (overrides or {}).items():
        if name not in by_name:
            raise ValueError(f"stage_overrides.{name}: no such stage; stages: {list(by_name)}")
        _merge(by_name[name], fields_)
    return values


def _merge(target: dict, update: Mapping) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), Mapping):
            target[key] = dict(target[key])
            _merge(target[key], value)
        else:
            target[key] = value


def _resolve_path(key: str, value: Any, base_dir: Path | None, locate: Locate | None) -> str:
    """A local path (relative ones against `base_dir`), else a hub repo id's folder."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}: must be a non-empty path, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    # A hub id in a graph is `owner/name`: a bare name is a folder beside the graph.
    if path.exists() or "/" not in value or not is_repo_id(value):
        return str(path)
    try:
        return str((locate or fetch_model)(value))
    except ValueError as e:
        looked = f"not a folder ({path}), and as a hub repo: "
        raise ValueError(f"{key}: {looked}{str(e).removeprefix('model: ')}") from None
