# SPDX-License-Identifier: Apache-2.0
"""Worker hooks: each omni feature of a vLLM worker is a hook, and one worker runs those its
engine names (vllm_omni.worker.omni_worker), so features compose instead of excluding each other.

    engine_args = with_worker_hooks(engine_args, "hidden_states")   # a stage's processor
    engine_args = cpp_engine_args(**engine_args)                    # adds "cpp" in front

A hook sees each `execute_model` and `sample_tokens` call of the worker and passes it on
(`call_next`), so hooks nest: the first named is the outermost. CPP's step timer and
micro-chunk splitting wraps the hidden-state capture, which then sees each micro-chunk as a step
of its own: a CPP-scheduled stage also hands on its hidden states. The names travel to the
worker processes in `additional_config[HOOKS_KEY]`; a name is a hook of this package or one a
model family registers (`ModelFamily.worker_hooks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

HOOKS_KEY = "omni_worker_hooks"
WORKER_MODULE = "vllm_omni.worker.omni_worker"
"""Where the worker that runs hooks lives (vLLM's `worker_cls` is a qualified name: it crosses
process boundaries as a string)."""


class WorkerHook(Protocol):
    """A feature of a stage's worker, built with the worker (`cls(worker)`). `install` runs once
    the worker's device and model runner exist."""

    def install(self) -> None: ...

    def execute_model(self, scheduler_output: Any, call_next: Callable[[Any], Any]) -> Any: ...

    def sample_tokens(self, grammar_output: Any, call_next: Callable[[Any], Any]) -> Any: ...


class PassThroughHook:
    """A WorkerHook base whose calls pass on unchanged; subclasses override what they need."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def install(self) -> None:
        pass

    def execute_model(self, scheduler_output: Any, call_next: Callable[[Any], Any]) -> Any:
        return call_next(scheduler_output)

    def sample_tokens(self, grammar_output: Any, call_next: Callable[[Any], Any]) -> Any:
        return call_next(grammar_output)


def hook_names(additional_config: Mapping[str, Any] | None) -> list[str]:
    return list((additional_config or {}).get(HOOKS_KEY) or [])


def worker_cls_for_platform() -> str:
    from vllm.platforms import current_platform

    return f"{WORKER_MODULE}.{'OmniCPUWorker' if current_platform.is_cpu() else 'OmniGPUWorker'}"


def with_worker_hooks(
    engine_args: Mapping[str, Any], *names: str, first: bool = False
) -> dict[str, Any]:
    """`engine_args` whose worker also runs the hooks `names` (after those already named, or in
    front of them with `first`; each hook once)."""
    worker = worker_cls_for_platform()
    given = engine_args.get("worker_cls")
    if given not in (None, "auto", worker):
        raise ValueError(
            f"worker_cls: {given!r} cannot run worker hooks {list(names)}; leave it unset"
        )
    additional = dict(engine_args.get("additional_config") or {})
    present = hook_names(additional)
    added = [n for n in names if n not in present]
    additional[HOOKS_KEY] = added + present if first else present + added
    return {**engine_args, "worker_cls": worker, "additional_config": additional}
