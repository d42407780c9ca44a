# SPDX-License-Identifier: Apache-2.0
"""One request's walk through the stage graph: a task per stage it runs.

A stage starts once all its source stages have finished the request and it has a slot
(`max_inflight`, back-pressure); a streaming stage (`stream_input`, on a streamed request) starts
with its source instead and reads it through a StageStream as the source emits. Each stage's
start, partial outputs and finish are reported to `on_event`, and its timing to the engine's
timing listeners.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_omni.engine.stage_stream import StageStream
from vllm_omni.outputs import StageTiming

if TYPE_CHECKING:
    from vllm_omni.engine.omni_engine import OmniEngine


@dataclass(frozen=True)
class StageEvent:
    """Progress of one request: `stage` has `started` or `finished` it, at monotonic `time`."""

    request_id: str
    stage: str
    status: str
    time: float


@dataclass(frozen=True)
class StageDelta:
    """Partial output of a stage while it runs, e.g. {"text": "Hel"} from a generating stage."""

    request_id: str
    stage: str
    data: dict[str, Any]
    time: float


OnEvent = Callable[[StageEvent | StageDelta], None]


class RequestRun:
    def __init__(
        self,
        engine: OmniEngine,
        request_id: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        on_event: OnEvent | None,
    ) -> None:
        self.engine, self.request_id = engine, request_id
        self.inputs, self.params, self.on_event = inputs, params, on_event
        self.tasks: dict[str, asyncio.Task] = {}
        self.timings: dict[str, StageTiming] = {}
        self.streams: dict[str, StageStream] = {}  # streaming stage -> what it reads
        self.listeners: dict[str, list[StageStream]] = {}  # source -> the streams it feeds
        for name in params:
            config = engine.graph[name]
            if config.stream_input and inputs.get("stream"):
                edges = {key: source.split(".")[1] for key, source in config.inputs.items()}
                self.streams[name] = StageStream(edges)
                self.listeners.setdefault(config.sources[0], []).append(self.streams[name])

    async def run(self) -> dict[str, dict[str, Any]]:
        """Every stage's outputs, by stage; cancelling cancels every stage's part."""
        try:
            for name in self.params:  # the stages this request runs, in topological order
                self.tasks[name] = asyncio.create_task(self._run_stage(name))
            await asyncio.gather(*self.tasks.values())
        finally:
            for task in self.tasks.values():
                task.cancel()
        return {name: task.result() for name, task in self.tasks.items()}

    async def _stage_inputs(self, name: str) -> dict[str, Any]:
        config = self.engine.graph[name]
        if not config.sources:
            return self.inputs
        options = {k: self.inputs[k] for k in self.engine.request_options if k in self.inputs}
        if name in self.streams:  # starts with its source, reads it as it goes
            return {**options, "upstream": self.streams[name]}
        results = await asyncio.gather(*(self.tasks[s] for s in config.sources))
        done = dict(zip(config.sources, results))
        for key, source in config.inputs.items():
            src, tensor = source.split(".")
            if tensor in done[src]:  # optional edges (e.g. no negative prompt)
                options[key] = done[src][tensor]
        return options

    def _emitter(self, name: str) -> Callable[[dict[str, Any]], None] | None:
        """What a stage's partial outputs go to: the streams it feeds and `on_event`."""
        streams, on_event = self.listeners.get(name, []), self.on_event
        if on_event is None and not streams:
            return None

        def emit(data: dict[str, Any]) -> None:
            for stream in streams:
                stream.put(data)
            if on_event is not None:
                on_event(StageDelta(self.request_id, name, data, time.monotonic()))

        return emit

    def _event(self, name: str, status: str, at: float) -> None:
        if self.on_event is not None:
            self.on_event(StageEvent(self.request_id, name, status, at))

    async def _run_stage(self, name: str) -> dict[str, Any]:
        inputs = await self._stage_inputs(name)
        queued = time.monotonic()
        async with self.engine.slots[name]:
            start = time.monotonic()
            self._event(name, "started", start)
            stage = self.engine.stages[name]
            out = await stage.run(self.request_id, inputs, self.params[name], self._emitter(name))
            for stream in self.listeners.get(name, []):
                stream.put(out, final=True)
        self.timings[name] = timing = StageTiming(queued, start, time.monotonic())
        for listener in self.engine.timing_listeners:
            listener(name, timing)
        self._event(name, "finished", timing.end)
        return out
