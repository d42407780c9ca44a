# SPDX-License-Identifier: Apache-2.0
"""AsyncOmniLLM: the asyncio API over a stage graph (what the omni server uses).

    omni = await AsyncOmniLLM.create("path/to/Qwen-Image")
    output = await omni.generate("a red cat", DiffusionSamplingParams(seed=0))
    async for event in omni.stream("a red cat", params):   # per-stage progress and partial
        print(event)                                       # outputs, then the output

Cancelling the awaiting task (or `abort(request_id)`) cancels the request in every stage and
frees its KV blocks and DiT cache entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.config.model_defaults import resolve_stage_graph
from vllm_omni.config.stage_config import StageGraph
from vllm_omni.diffusion.executor_kind import StageInfo
from vllm_omni.engine.omni_engine import OmniEngine
from vllm_omni.engine.request_run import StageDelta, StageEvent
from vllm_omni.outputs import OmniRequestOutput, StageTiming


@dataclass(frozen=True)
class RequestFinished:
    """The last item of `stream`."""

    output: OmniRequestOutput


class AsyncOmniLLM:
    def __init__(self, engine: OmniEngine) -> None:
        """Use `create`; this takes an engine whose stages are already started."""
        self.engine = engine

    @classmethod
    async def create(
        cls,
        model: str | Path | None = None,
        *,
        stage_configs: str | Path | StageGraph | Mapping | None = None,
        stage_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        revision: str | None = None,
        download_dir: str | Path | None = None,
    ) -> AsyncOmniLLM:
        """Build the stage graph (as OmniLLM does; `model` a folder or hub repo id) and start
        every stage."""
        graph = resolve_stage_graph(
            model, stage_configs, stage_overrides, revision=revision, download_dir=download_dir
        )
        engine = OmniEngine(graph)
        await engine.start()
        return cls(engine)

    @property
    def graph(self) -> StageGraph:
        return self.engine.graph

    def prepare(self, prompt, sampling_params: Any = None) -> tuple[dict, dict]:
        """Validate a request without running it (raises ValueError naming the field)."""
        return self.engine.prepare(prompt, sampling_params)

    async def generate(
        self,
        prompt: str | Mapping[str, str],
        sampling_params: Any = None,
        request_id: str | None = None,
    ) -> OmniRequestOutput:
        return await self.engine.generate(prompt, sampling_params, request_id)

    async def run_prepared(
        self,
        inputs: dict[str, Any],
        params: dict[str, Any],
        request_id: str | None = None,
        on_event: Callable[[StageEvent | StageDelta], None] | None = None,
    ) -> OmniRequestOutput:
        """Run what `prepare` returned; `on_event` hears each stage start and finish and each
        partial output (as `stream` yields them)."""
        return await self.engine.run_prepared(inputs, params, request_id, on_event)

    async def stream(
        self,
        prompt: str | Mapping[str, str],
        sampling_params: Any = None,
        request_id: str | None = None,
    ) -> AsyncIterator[StageEvent | StageDelta | RequestFinished]:
        """Yield a StageEvent as each stage starts and finishes the request, a StageDelta for
        each partial output (the thinker's text as it is written, the talker's codes, audio
        chunks: stages marked `stream_input` start with their source), then the output."""
        if isinstance(prompt, str):
            prompt = {"prompt": prompt}
        inputs, params = self.engine.prepare({**prompt, "stream": True}, sampling_params)
        events: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(
            self.engine.run_prepared(inputs, params, request_id, on_event=events.put_nowait)
        )
        task.add_done_callback(lambda _: events.put_nowait(None))
        try:
            while (event := await events.get()) is not None:
                yield event
            yield RequestFinished(task.result())
        finally:
            task.cancel()

    async def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    @property
    def request_options(self) -> tuple[str, ...]:
        """The prompt-mapping fields the graph's stages take beyond the prompt (e.g. `voice`,
        an editing pipeline's `image`)."""
        return self.engine.request_options

    def stage_info(self) -> dict[str, StageInfo]:
        """What each process stage reported when it came up (image sizes, sample rates, ...)."""
        return {
            name: stage.info
            for name, stage in self.engine.stages.items()
            if stage.engine_type == "DiT"
        }

    def dead_stages(self) -> list[str]:
        """Stages whose engine or process is gone."""
        return self.engine.dead_stages()

    def observe(
        self,
        on_stage_done: Callable[[str, StageTiming], None],
        on_step: Callable[[str, float], None],
    ) -> None:
        """Hear (stage, timing) each time a stage finishes a request, and (stage, seconds) for
        each engine step of a process stage (the server's metrics)."""
        self.engine.timing_listeners.append(on_stage_done)
        for name, stage in self.engine.stages.items():
            if stage.engine_type == "DiT":
                stage.step_listeners.append(lambda seconds, name=name: on_step(name, seconds))

    async def stats(self) -> dict[str, Any]:
        return await self.engine.stats()

    def shutdown(self) -> None:
        self.engine.shutdown()
