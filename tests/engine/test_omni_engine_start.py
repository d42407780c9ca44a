# SPDX-License-Identifier: Apache-2.0
"""OmniEngine.start: vLLM's plugins are loaded once, on the calling thread, before any stage."""

from __future__ import annotations

import asyncio

import vllm.plugins

from vllm_omni.config.stage_config import StageGraph
from vllm_omni.engine.omni_engine import OmniEngine


class _Stage:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def start(self) -> None:
        self.events.append("stage")

    def shutdown(self) -> None:
        pass


def test_start_loads_vllm_plugins_before_any_stage(monkeypatch) -> None:
    # vLLM sets plugins_loaded before it runs the plugins: two stage threads loading them at
    # once let the second build its model config before the talker architecture is registered.
    events: list[str] = []
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.setattr(
        vllm.plugins, "load_plugins_by_group", lambda group: {"p": lambda: events.append("plugin")}
    )
    graph = StageGraph.from_dict(
        {"stages": [{"name": n, "engine_type": "AR", "model": "/m"} for n in ("a", "b")]}
    )
    engine = OmniEngine(graph)
    engine.stages = {"a": _Stage(events), "b": _Stage(events)}
    asyncio.run(engine.start())
    assert events == ["plugin", "stage", "stage"]
