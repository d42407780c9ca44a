# SPDX-License-Identifier: Apache-2.0
"""The vLLM worker of omni stages: vLLM's own worker for the platform, running the hooks its
engine names (vllm_omni.worker.hooks) around each `execute_model` and `sample_tokens` call."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker

from vllm_omni.worker.hooks import HOOKS_KEY, WorkerHook, hook_names


def _cpp() -> type:
    from vllm_omni.cpp.worker import CPPStepHook

    return CPPStepHook


def _hidden_states() -> type:
    from vllm_omni.worker.hidden_states import HiddenStatesHook

    return HiddenStatesHook


BUILTIN_HOOKS: dict[str, Callable[[], type]] = {"cpp": _cpp, "hidden_states": _hidden_states}
"""This package's hooks, imported on use (each brings its own dependencies)."""


def hook_class(name: str) -> type:
    from vllm_omni.registry import worker_hooks

    known = {**BUILTIN_HOOKS, **worker_hooks()}
    if name not in known:
        raise ValueError(f"{HOOKS_KEY}: unknown worker hook {name!r}; known: {sorted(known)}")
    return known[name]()


class OmniWorkerMixin:
    def init_device(self) -> None:
        super().init_device()
        names = hook_names(self.vllm_config.additional_config)
        self.hooks: list[WorkerHook] = [hook_class(name)(self) for name in names]
        for hook in self.hooks:
            hook.install()

    def execute_model(self, scheduler_output):
        return self._through_hooks("execute_model", super().execute_model)(scheduler_output)

    def sample_tokens(self, grammar_output):
        return self._through_hooks("sample_tokens", super().sample_tokens)(grammar_output)

    def _through_hooks(self, method: str, last: Callable[[Any], Any]) -> Callable[[Any], Any]:
        call = last
        for hook in reversed(self.hooks):
            call = functools.partial(getattr(hook, method), call_next=call)
        return call

    def cpp_take_step_records(self) -> list[dict[str, Any]]:
        """Drain the `cpp` hook's step records (`collective_rpc("cpp_take_step_records")`)."""
        cls = _cpp()
        hook = next((h for h in self.hooks if isinstance(h, cls)), None)
        return hook.take_records() if hook is not None else []


class OmniCPUWorker(OmniWorkerMixin, CPUWorker):
    pass


class OmniGPUWorker(OmniWorkerMixin, Worker):
    pass
