# SPDX-License-Identifier: Apache-2.0
"""OmniEngine: runs requests through a stage graph, each stage on its own engine.

Each request is one asyncio task that walks the graph: a stage starts as soon as all its
source stages have finished that request, so requests overlap across stages (stage 0 of
request k+1 runs while stage 1 runs request k). Each stage admits at most `max_inflight`
requests at a time (back-pressure: the rest wait in the orchestrator, not in the stage).
Cancelling a request's task cancels it in every stage, which frees its KV blocks (AR) and its
DiT cache entry.

OmniLLM (sync) and AsyncOmniLLM (asyncio) are thin front-ends over this class.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vllm.plugins import load_general_plugins

from vllm_omni.config.stage_config import StageGraph
from vllm_omni.engine.ar_stage import ARStage
from vllm_omni.engine.process_host import join_ray, leave_ray
from vllm_omni.engine.process_stage import ProcessStage
from vllm_omni.engine.ray_ar_stage import make_ar_stage
from vllm_omni.engine.request_run import OnEvent, RequestRun
from vllm_omni.engine.stage_protocol import Stage
from vllm_omni.errors import FieldError
from vllm_omni.logger import init_logger
from vllm_omni.outputs import MultimodalOutputProcessor, OmniRequestOutput, StageTiming

logger = init_logger(__name__)

PROMPT_FIELDS = ("prompt", "negative_prompt", "messages")
REQUEST_FIELDS = ("modalities", "stream")
"""Request-level options of every graph; stages declare more (`request_options`). Every stage
sees the request's options among its inputs."""


class OmniEngine:
    def __init__(self, graph: StageGraph) -> None:
        self.graph = graph
        self.stages: dict[str, Stage] = {
            s.name: make_ar_stage(s) if s.engine_type == "AR" else ProcessStage(s)
            for s in graph.stages
        }
        self.slots = {s.name: asyncio.Semaphore(s.max_inflight) for s in graph.stages}
        self._requests: dict[str, asyncio.Task] = {}
        self.output_processor = MultimodalOutputProcessor()
        self.counters = {"finished": 0, "failed": 0, "aborted": 0}
        # Hear (stage name, StageTiming) each time a stage finishes a request.
        self.timing_listeners: list[Callable[[str, StageTiming], None]] = []

    async def start(self) -> None:
        """Start every stage at once (DiT processes and vLLM engines load in parallel)."""

        async def start_stage(stage):
            if isinstance(stage, ARStage):  # AsyncLLM's constructor blocks; keep the loop free
                await asyncio.to_thread(stage.start)
            else:
                await stage.start()

        on_ray = [s for s in self.graph.stages if s.backend == "ray"]
        try:
            # Before the stage threads: vLLM marks its plugins loaded before it runs them, so a
            # second stage thread would skip them and find the talker architecture unregistered
            # while the first still registers it (seen once: a start failed with "Model
            # architectures ['Qwen2_5OmniTalkerForCodec'] are not supported").
            load_general_plugins()
            if on_ray:  # before the stages, which would start a Ray too small for them all
                # On this thread, the server's main one: joining keeps its SIGTERM handler.
                join_ray(sum(s.resources.get("CPU", 1) for s in on_ray))
            await asyncio.gather(*(start_stage(s) for s in self.stages.values()))
        except BaseException:
            self.shutdown()
            raise

    # ------------------------------------------------------------------ requests
    @functools.cached_property  # the stages are fixed; read per request and per stage
    def request_options(self) -> tuple[str, ...]:
        """Fields a prompt mapping may carry besides the prompt: `modalities`, `stream`, and the
        options the graph's stages read (e.g. a speaking stage's voice)."""
        declared = [o for stage in self.stages.values() for o in stage.request_options]
        return REQUEST_FIELDS + tuple(o for o in dict.fromkeys(declared) if o not in PROMPT_FIELDS)

    def prepare(
        self, prompt: str | Mapping[str, Any], sampling_params: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Validate a request; returns (prompt inputs, parameters per stage it runs).

        A prompt mapping may also carry request options (`request_options`): `modalities` (a
        subset of the graph's outputs; default all of them), `stream` (True: stages marked
        `stream_input` start with their source and emit partial outputs; what
        AsyncOmniLLM.stream and streamed HTTP replies ask for) and the stages' own."""
        inputs = self._prompt_inputs(prompt)
        inputs["modalities"] = self._modalities(inputs.get("modalities"))
        runs = self.graph.stages_for(inputs["modalities"])
        self._check_options_used(inputs, runs)
        given = self._params_by_stage(sampling_params)
        params: dict[str, Any] = {}
        shared: dict[type, Any] = {}  # process stages given nothing share the first one's
        for name in runs:
            stage, p = self.stages[name], given.get(name)
            if isinstance(stage, ProcessStage) and p is None and stage.kind.params_type in shared:
                params[name] = shared[stage.kind.params_type]
                continue
            params[name] = stage.validate(p, inputs)
            if isinstance(stage, ProcessStage):
                shared.setdefault(stage.kind.params_type, params[name])
            inputs.update(stage.prompt_inputs(params[name]))
        return inputs, params

    def _prompt_inputs(self, prompt: str | Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(prompt, str):
            inputs: dict[str, Any] = {"prompt": prompt}
        elif isinstance(prompt, Mapping):
            known = PROMPT_FIELDS + self.request_options
            unknown = sorted(set(prompt) - set(known))
            if unknown:
                raise FieldError(f"prompt.{unknown[0]}", f"unknown field; known: {list(known)}")
            inputs = dict(prompt)
        else:
            raise FieldError(
                "prompt", f"must be a string or a mapping, got {type(prompt).__name__}"
            )
        for name in ("prompt", "negative_prompt"):  # the stages check their own options
            value = inputs.get(name)
            if value is not None and not isinstance(value, str):
                raise FieldError(name, f"must be a string, got {type(value).__name__}")
        if not isinstance(inputs.get("stream", False), bool):
            raise FieldError("stream", f"must be true or false, got {inputs['stream']!r}")
        if inputs.get("messages") is not None:
            self._check_messages(inputs)
        elif not (inputs.get("prompt") or "").strip():
            raise FieldError("prompt", "must not be empty")
        return inputs

    def _check_options_used(self, inputs: dict[str, Any], runs: list[str]) -> None:
        """A stage option given to a request that runs no stage reading it is a mistake (a
        voice for a text-only reply), not something to ignore."""
        for option in self.request_options[len(REQUEST_FIELDS) :]:
            if inputs.get(option) is None:
                continue
            if not any(option in self.stages[name].request_options for name in runs):
                raise FieldError(
                    f"{option}",
                    f"no stage of this request takes it (it asks for {list(inputs['modalities'])})",
                )

    def _check_messages(self, inputs: dict[str, Any]) -> None:
        """Chat messages go to a first stage that renders them with vLLM's chat template and
        multimodal parsing (Qwen2.5-Omni's thinker); vLLM checks their content."""
        messages = inputs["messages"]
        if inputs.get("prompt") is not None:
            raise FieldError("messages", "give either a prompt or messages, not both")
        if not isinstance(messages, list) or not messages:
            raise FieldError("messages", "must be a non-empty list of messages")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or "role" not in message:
                raise FieldError(f"messages[{i}]", "must be a mapping with a 'role'")
        first = [self.stages[s.name] for s in self.graph.stages if not s.sources]
        if not all(stage.takes_messages for stage in first):
            raise FieldError("messages", "this model takes a text prompt, not chat messages")

    def _modalities(self, requested: Any) -> tuple[str, ...]:
        available = self.graph.output_modalities
        if requested is None:
            return available
        if isinstance(requested, str) or not isinstance(requested, Sequence):
            raise FieldError("modalities", f"must be a list of strings, got {requested!r}")
        for m in requested:
            if m not in available:
                raise FieldError("modalities", f"{m!r} is not an output of this model; {available}")
        if not requested:
            raise FieldError("modalities", "must not be empty")
        return tuple(requested)

    def _params_by_stage(self, sampling_params: Any) -> dict[str, Any]:
        if sampling_params is None:
            return {}
        if isinstance(sampling_params, Mapping):
            for name in sampling_params:
                if name not in self.stages:
                    raise FieldError(
                        f"sampling_params.{name}", f"no such stage; stages: {list(self.stages)}"
                    )
            return dict(sampling_params)
        if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
            raise FieldError(
                "sampling_params",
                "one request takes one object or a dict {stage name: params}, not a list",
            )

        # One object: it goes to every stage of the kind it configures.
        targets = [
            name for name, stage in self.stages.items() if stage.takes_params(sampling_params)
        ]
        if not targets:
            raise FieldError("sampling_params", f"no stage takes {type(sampling_params).__name__}")
        return {name: sampling_params for name in targets}

    async def generate(
        self,
        prompt: str | Mapping[str, str],
        sampling_params: Any = None,
        request_id: str | None = None,
    ) -> OmniRequestOutput:
        inputs, params = self.prepare(prompt, sampling_params)
        return await self.run_prepared(inputs, params, request_id)

    async def run_prepared(
        self,
        inputs: dict[str, Any],
        params: dict[str, Any],
        request_id: str | None = None,
        on_event: OnEvent | None = None,
    ) -> OmniRequestOutput:
        """Run a request validated by `prepare`; `on_event` hears each stage start and finish,
        and the partial outputs of stages that stream (StageDelta)."""
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._requests:
            raise FieldError("request_id", f"{request_id!r} is already running")
        self._requests[request_id] = asyncio.current_task()
        arrival = time.monotonic()
        run = RequestRun(self, request_id, inputs, params, on_event)
        try:
            outputs = await run.run()
        except asyncio.CancelledError:
            self.counters["aborted"] += 1
            raise
        except BaseException:
            self.counters["failed"] += 1
            raise
        finally:
            self._requests.pop(request_id, None)
        self.counters["finished"] += 1
        seed = next(  # the first process stage's: the seed that reproduces the output
            (p.seed for n, p in params.items() if isinstance(self.stages[n], ProcessStage)), None
        )
        final = {s.name: outputs[s.name] for s in self.graph.final_stages if s.name in outputs}
        return self.output_processor.process(
            request_id,
            inputs.get("prompt"),
            final,
            outputs,
            seed=seed,
            stage_timings=run.timings,
            arrival=arrival,
            finished=time.monotonic(),
        )

    def abort(self, request_id: str) -> bool:
        task = self._requests.get(request_id)
        if task is None:
            return False
        task.cancel()
        return True

    def dead_stages(self) -> list[str]:
        """Stages whose engine or process is gone (the server's /health reports them)."""
        return [name for name, stage in self.stages.items() if not stage.is_alive]

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": {**self.counters, "running": len(self._requests)}}
        for name, stage in self.stages.items():
            s = stage.stats()
            out[name] = await s if asyncio.iscoroutine(s) else s
        return out

    def shutdown(self) -> None:
        """On the engine's loop. The stages go down together: each one's processes take seconds
        to exit (unmapping a KV cache alone takes one or two on a CPU), one after another they
        added up (8 s for Qwen2.5-Omni's three)."""
        for stage in self.stages.values():
            if isinstance(stage, ARStage):
                stage.stop_output_handler()  # here, on the loop, before its core goes
        with ThreadPoolExecutor(max(1, len(self.stages)), "stage-shutdown") as pool:
            futures = {name: pool.submit(stage.shutdown) for name, stage in self.stages.items()}
        for name, future in futures.items():
            if (error := future.exception()) is not None:  # the others went down all the same
                logger.error("stage %r did not shut down cleanly", name, exc_info=error)
        if any(s.backend == "ray" for s in self.graph.stages):
            leave_ray()
