# SPDX-License-Identifier: Apache-2.0
"""ProcessStage: the orchestrator's handle on a stage running in a process of its own (a DiT, a VAE
decoder, a vocoder) or a Ray actor.

Requests go in through one queue and results come back through another; a reader thread
hands results to the orchestrator's event loop. Tensors cross the process boundary as numpy
arrays (plain pickles, no shared-memory file descriptors to leak; on Ray, one object ref per
request). Where the loop runs: `vllm_omni.engine.process_host`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from vllm_omni.config.stage_config import StageConfig
from vllm_omni.diffusion.deadline import DeadlineUnreachable
from vllm_omni.diffusion.executor_kind import StageInfo
from vllm_omni.engine.busy import BusyTracker
from vllm_omni.engine.process_host import start_stage_process
from vllm_omni.logger import init_logger
from vllm_omni.platform.cpu_defaults import malloc_env_defaults
from vllm_omni.registry import executor_kind

logger = init_logger(__name__)

START_TIMEOUT_S = 600.0


class ProcessStageError(RuntimeError):
    pass


class ProcessStage:
    """A process stage: its executor (a stage's `executor:`, registered by a model family as an
    ExecutorKind) says what its requests take and what its results mean."""

    engine_type = "DiT"
    takes_messages = False

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.kind = executor_kind(config.executor)
        self.dit_config = config.dit_config()
        if _runs_on_cpu(self.dit_config):  # the executor's CPU settings, where none is given
            unset = {k: v for k, v in self.kind.cpu_defaults.items() if k not in config.dit}
            self.dit_config = replace(self.dit_config, **unset)
        self.busy = BusyTracker()  # the stage process's engine steps
        self.step_listeners: list[Callable[[float], None]] = []  # hear each step's seconds
        self.info: StageInfo = StageInfo()
        self.last_stats: dict[str, Any] = {}
        self.num_finished = 0
        self._pending: dict[Any, asyncio.Future] = {}
        self._progress: dict[str, Callable[[dict[str, Any]], None]] = {}  # request -> its emit
        self._tokens = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process = None
        self._reader: threading.Thread | None = None
        self._ready: asyncio.Future | None = None

    @property
    def name(self) -> str:
        return self.config.name

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        start = time.perf_counter()
        if self.config.backend == "local" and _runs_on_cpu(self.dit_config):
            # Read by the stage process at its start: glibc would otherwise hand a VAE decode's
            # freed activations back to the system, and the denoising step after each decode
            # page-faults its own back in (tiny Qwen-Image, 192x192, measured once: 11 ms after
            # a decode against 1.3-2.6 ms in a row; 5.5 ms with these). As for vLLM's engines.
            os.environ.update(malloc_env_defaults(dict(os.environ)))
        self._process = await asyncio.to_thread(  # a Ray actor may wait to be placed
            start_stage_process,
            self.name,
            self.dit_config,
            self.config.scheduler,
            self.config.executor,
            self.config.backend,
            self.config.resources,
        )
        self._inbox, self._outbox = self._process.inbox, self._process.outbox
        self._reader = threading.Thread(
            target=self._read, name=f"DiTReader-{self.name}", daemon=True
        )
        self._reader.start()
        self.info = await asyncio.wait_for(self._ready, START_TIMEOUT_S)
        logger.info(
            "DiT stage %r: up in %.1f s (%s)",
            self.name,
            time.perf_counter() - start,
            self._process.backend,
        )

    # ------------------------------------------------------------------ requests
    @property
    def request_options(self) -> tuple[str, ...]:
        return self.kind.request_options

    def takes_params(self, params: Any) -> bool:
        """Whether one parameter object given for a whole request is this stage's."""
        return isinstance(params, self.kind.params_type)

    def validate(self, params: Any, inputs: dict[str, Any] | None = None) -> Any:
        """The request's parameters with its options (`inputs`: the prompt mapping) applied and
        what it left open filled in; raises ValueError naming the field."""
        if inputs:
            params = self.kind.apply_options(params, inputs, self.info)
        return self.kind.validate(params, self.name, self.config.scheduler, self.info)

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        return self.kind.prompt_inputs(params)

    async def run(
        self, request_id: str, inputs: dict[str, Any], params, emit=None
    ) -> dict[str, Any]:
        """`emit`, if given, hears partial outputs (of an executor that streams its input) and
        the request's progress after each engine step that ran it: {"progress": fraction,
        "step": steps done, "total_steps": steps in all}."""
        if "upstream" in inputs:
            out = await self.kind.stream(self, request_id, inputs["upstream"], params, emit)
        else:
            raw = await self.submit(request_id, inputs, params, progress=emit)
            out = self.kind.outputs(raw, self.info)
        self.num_finished += 1
        return out

    async def submit(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        """One request through the stage process; its raw result. `progress` hears the
        request's steps as they are done."""
        future = self._loop.create_future()
        self._pending[request_id] = future
        if progress is not None:
            self._progress[request_id] = progress
        arrays = {k: _transferable(v) for k, v in inputs.items() if _is_transferable(v)}
        try:
            self._inbox.put(("add", request_id, (self._process.pack(arrays), params)))
            return await future
        except asyncio.CancelledError:
            self._inbox.put(("abort", request_id, None))
            raise
        finally:
            self._pending.pop(request_id, None)
            self._progress.pop(request_id, None)

    async def stats(self) -> dict[str, Any]:
        token = ("stats", next(self._tokens))
        future = self._loop.create_future()
        self._pending[token] = future
        self._inbox.put(("stats", token, None))
        try:
            self.last_stats = await asyncio.wait_for(future, 30)
        finally:
            self._pending.pop(token, None)
        return {**self.last_stats, "num_finished": self.num_finished}

    # ------------------------------------------------------------------ plumbing
    @property
    def pid(self) -> int | None:
        """The local stage process's id (None on Ray)."""
        return self._process.pid if self._process is not None else None

    @property
    def is_alive(self) -> bool:
        return self._process is not None and self._process.is_alive

    def _read(self) -> None:
        process = self._process
        while True:
            try:
                message = self._outbox.get(timeout=1.0)
            except queue.Empty:
                if process.is_alive:
                    continue
                # Killed (e.g. out of memory) without a word: fail what it held, loudly.
                message = ("died", None, process.death())
            if message is None:
                return
            self._loop.call_soon_threadsafe(self._dispatch, message)
            if message[0] == "died":
                return

    def _dispatch(self, message: tuple) -> None:
        kind, key, payload = message
        if kind == "ready":
            self._ready.set_result(payload)
        elif kind == "error":
            if not self._ready.done():
                self._ready.set_exception(
                    ProcessStageError(f"DiT stage {self.name!r} failed to start:\n{payload}")
                )
        elif kind == "died":
            error = ProcessStageError(f"DiT stage {self.name!r}: {payload}")
            logger.error("%s", error)
            for future in [self._ready, *self._pending.values()]:
                if future is not None and not future.done():
                    future.set_exception(error)
        elif kind == "step":
            start, end, _, progress = payload
            self.busy.add(start, end)
            for listener in self.step_listeners:
                listener(end - start)
            for request_id, (done, total) in progress.items():
                emit = self._progress.get(request_id)
                if emit is not None:
                    emit({"progress": done / total, "step": done, "total_steps": total})
        else:
            future = self._pending.get(key)
            if future is None or future.done():
                return  # aborted meanwhile
            if kind == "failed":  # the request's fault as raised; anything else, the stage's
                refused = isinstance(payload, (ValueError, DeadlineUnreachable))
                future.set_exception(payload if refused else ProcessStageError(str(payload)))
            else:
                future.set_result(payload)

    def shutdown(self) -> None:
        if self._process is None:
            return
        self._process.stop()
        if self._reader is not None:
            self._reader.join(timeout=10)
        self._process.close()
        self._process = self._inbox = self._outbox = None


def _runs_on_cpu(config) -> bool:
    return config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())


def _is_transferable(value: Any) -> bool:
    """What crosses to the stage process: tensors (as numpy arrays), text (the prompt of a
    stage that runs a whole pipeline) and images (its input images, as a list of arrays)."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, Image.Image) for v in value)
    return torch.is_tensor(value) or isinstance(value, (str, Image.Image))


def _transferable(value: Any) -> Any:
    if isinstance(value, (list, Image.Image)):
        images = value if isinstance(value, list) else [value]
        return [np.asarray(image) for image in images]
    return value.detach().cpu().numpy() if torch.is_tensor(value) else value
