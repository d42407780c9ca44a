# SPDX-License-Identifier: Apache-2.0
"""Worker hooks without an engine: how engine arguments name them, how the worker nests them,
and that a name nobody registered is an error naming the setting."""

from __future__ import annotations

import pytest

from vllm_omni.cpp.engine_args import cpp_engine_args
from vllm_omni.worker.hooks import HOOKS_KEY, PassThroughHook, with_worker_hooks
from vllm_omni.worker.omni_worker import OmniWorkerMixin, hook_class


def test_hooks_are_added_once_in_order_and_cpp_goes_first() -> None:
    args = with_worker_hooks({"additional_config": {"x": 1}}, "hidden_states")
    assert args["worker_cls"].startswith("vllm_omni.worker.omni_worker.Omni")
    assert args["additional_config"] == {"x": 1, HOOKS_KEY: ["hidden_states"]}
    again = with_worker_hooks(args, "hidden_states", "other")
    assert again["additional_config"][HOOKS_KEY] == ["hidden_states", "other"]
    cpp = cpp_engine_args(**args)
    assert cpp["additional_config"][HOOKS_KEY] == ["cpp", "hidden_states"]
    assert cpp["additional_config"]["x"] == 1 and "cpp" in cpp["additional_config"]


def test_a_worker_class_that_cannot_run_hooks_is_refused() -> None:
    with pytest.raises(ValueError, match="worker_cls: 'my.Worker' cannot run worker hooks"):
        with_worker_hooks({"worker_cls": "my.Worker"}, "hidden_states")
    with pytest.raises(ValueError, match="CPP runs its own worker hook"):
        cpp_engine_args(worker_cls="my.Worker")


def test_hook_names_resolve_to_this_package_s_and_the_families() -> None:
    assert hook_class("cpp").__name__ == "CPPStepHook"
    assert hook_class("hidden_states").__name__ == "HiddenStatesHook"
    assert hook_class("qwen25_omni_talker").__name__ == "TalkerConditioningHook"
    with pytest.raises(ValueError, match=r"omni_worker_hooks: unknown worker hook 'nope'"):
        hook_class("nope")


class _Base:
    """Stands in for vLLM's worker: records what reaches it."""

    def __init__(self) -> None:
        self.seen: list = []

    def execute_model(self, scheduler_output):
        self.seen.append(scheduler_output)
        return f"ran {scheduler_output}"

    def sample_tokens(self, grammar_output):
        return "sampled"


class _Worker(OmniWorkerMixin, _Base):
    pass


class _Tag(PassThroughHook):
    def __init__(self, worker, tag: str) -> None:
        super().__init__(worker)
        self.tag = tag

    def execute_model(self, scheduler_output, call_next):
        return f"{self.tag}({call_next(scheduler_output + self.tag)})"


class _Split(PassThroughHook):
    """Like CPP's micro-chunks: one call becomes two for the hooks inside it."""

    def execute_model(self, scheduler_output, call_next):
        call_next(scheduler_output + "1")
        return call_next(scheduler_output + "2")


def test_the_first_hook_is_the_outermost_and_each_sees_every_inner_call() -> None:
    worker = _Worker()
    worker.hooks = [_Split(worker), _Tag(worker, "a"), _Tag(worker, "b")]
    assert worker.execute_model("s") == "a(b(ran s2ab))"
    assert worker.seen == ["s1ab", "s2ab"]
    assert worker.sample_tokens(None) == "sampled"  # hooks that do not sample pass it on
