# SPDX-License-Identifier: Apache-2.0
"""DiTStage: the orchestrator's handle on a DiT stage running in its own process or Ray actor.

Requests go in through one queue and results come back through another; a reader thread
hands results to the orchestrator's event loop. Tensors cross the process boundary as numpy
arrays (plain pickles, no shared-memory file descriptors to leak; on Ray, one object ref per
request). Where the loop runs: `vllm_omni.engine.stage_process`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from vllm_omni.config.stage_config import StageConfig
from vllm_omni.diffusion.deadline import DeadlineUnreachable
from vllm_omni.diffusion.params import Code2WavParams, DiffusionSamplingParams
from vllm_omni.engine.busy import BusyTracker
from vllm_omni.engine.stage_process import start_stage_process
from vllm_omni.logger import init_logger
from vllm_omni.platform.cpu_defaults import malloc_env_defaults

logger = init_logger(__name__)

START_TIMEOUT_S = 600.0


class DiTStageError(RuntimeError):
    pass


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over a stage's result; a copy if the array is read-only (a Ray actor's result,
    mapped from the object store), which torch would share without guarding it."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


class DiTStage:
    engine_type = "DiT"

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.dit_config = config.dit_config()
        if (
            config.executor in ("vae_decoder", "code2wav")
            and self.dit_config.num_threads is None
            and _runs_on_cpu(self.dit_config)
        ):
            # vae_decoder: VAE decoding barely scales with threads (measured: 41 vs 38 ms per
            # 128x128 image on 1 vs 2 threads); one thread leaves the other cores to the DiT,
            # whose matmuls do scale. With both on all cores, OpenMP threads spin against each
            # other. code2wav: vLLM binds the thinker's and talker's workers to the cores it does
            # not reserve, so a second decoding thread lands on a busy worker core and every
            # OpenMP barrier waits for it (2-core EPYC, streamed request alone: first audio
            # 0.95-7.7 s on 2 threads, 0.74-1.13 s on 1; the whole reply 6.8-11 s vs 4.6-6.2 s).
            self.dit_config = replace(self.dit_config, num_threads=1)
        if (
            config.executor == "code2wav"
            and "max_num_seqs" not in config.dit
            and _runs_on_cpu(self.dit_config)
        ):
            # On a CPU, batching decodes saves little (measured on a 2-core EPYC, one thread,
            # 512 codes: 0.96 s alone, 0.74 s each in a batch of 2, 0.93 s in a batch of 4), and
            # a request's audio would wait for its whole batch.
            self.dit_config = replace(self.dit_config, max_num_seqs=1)
        self.busy = BusyTracker()  # the DiT process's engine steps
        self.step_listeners: list[Callable[[float], None]] = []  # hear each step's seconds
        self.info: dict[str, Any] = {}
        self.last_stats: dict[str, Any] = {}
        self.num_finished = 0
        self._pending: dict[Any, asyncio.Future] = {}
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
    def is_code2wav(self) -> bool:
        return self.config.executor == "code2wav"

    def validate(self, params: Any) -> DiffusionSamplingParams | Code2WavParams:
        """Fill in size and seed; reject what the pipeline cannot do, naming the field."""
        if self.is_code2wav:
            return self._validate_code2wav(params)
        if params is None:
            params = DiffusionSamplingParams()
        if not isinstance(params, DiffusionSamplingParams):
            raise ValueError(
                f"sampling_params.{self.name}: a DiT stage takes DiffusionSamplingParams, "
                f"got {type(params).__name__}"
            )
        if params.cache_threshold and self.config.scheduler != "step":
            raise ValueError(
                f"cache_threshold: residual caching needs step-level scheduling; stage "
                f"{self.name!r} runs whole requests ({self.config.scheduler!r})"
            )
        height, width = self.info["default_size"]
        multiple = self.info["size_multiple"]
        deadline = params.deadline
        if deadline is None and params.latency_slo_ms is not None:
            deadline = time.time() + params.latency_slo_ms / 1000  # the SLO counts from here
        params = replace(
            params,
            height=params.height or height,
            width=params.width or width,
            seed=params.seed if params.seed is not None else random.randrange(2**63),
            deadline=deadline,
        )
        for name in ("height", "width"):
            if getattr(params, name) % multiple:
                raise ValueError(
                    f"{name}: must be a multiple of {multiple}, got {getattr(params, name)}"
                )
        return params

    def _validate_code2wav(self, params: Any) -> Code2WavParams:
        if params is None:
            params = Code2WavParams()
        if not isinstance(params, Code2WavParams):
            raise ValueError(
                f"sampling_params.{self.name}: a code2wav stage takes Code2WavParams, "
                f"got {type(params).__name__}"
            )
        voices = self.info["voices"]
        if params.voice not in voices:
            raise ValueError(f"voice: unknown voice {params.voice!r}; known: {voices}")
        if params.seed is None:
            params = replace(params, seed=random.randrange(2**63))
        return params

    async def run(
        self, request_id: str, inputs: dict[str, Any], params, emit=None
    ) -> dict[str, Any]:
        """`emit`, if given, hears partial outputs (audio chunks of a streaming code2wav)."""
        if "upstream" in inputs:
            from vllm_omni.engine.code2wav_stream import stream_code2wav

            out = await stream_code2wav(self, request_id, inputs["upstream"], params, emit)
            self.num_finished += 1
            return out
        result = await self.submit(request_id, inputs, params)
        self.num_finished += 1
        if self.is_code2wav:
            return {"audio": as_tensor(result), "sample_rate": self.info["sample_rate"]}
        if isinstance(result, np.ndarray) and result.dtype != np.uint8:
            return {"latents": as_tensor(result)}
        return {"image": result}

    async def submit(self, request_id: str, inputs: dict[str, Any], params) -> Any:
        """One request through the stage process; its raw result."""
        future = self._loop.create_future()
        self._pending[request_id] = future
        arrays = {k: v.detach().cpu().numpy() for k, v in inputs.items() if torch.is_tensor(v)}
        try:
            self._inbox.put(("add", request_id, (self._process.pack(arrays), params)))
            return await future
        except asyncio.CancelledError:
            self._inbox.put(("abort", request_id, None))
            raise
        finally:
            self._pending.pop(request_id, None)

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
                    DiTStageError(f"DiT stage {self.name!r} failed to start:\n{payload}")
                )
        elif kind == "died":
            error = DiTStageError(f"DiT stage {self.name!r}: {payload}")
            logger.error("%s", error)
            for future in [self._ready, *self._pending.values()]:
                if future is not None and not future.done():
                    future.set_exception(error)
        elif kind == "step":
            self.busy.add(payload[0], payload[1])
            for listener in self.step_listeners:
                listener(payload[1] - payload[0])
        else:
            future = self._pending.get(key)
            if future is None or future.done():
                return  # aborted meanwhile
            if kind == "failed":
                error_type, text = payload
                errors = {"ValueError": ValueError, "DeadlineUnreachable": DeadlineUnreachable}
                future.set_exception(errors.get(error_type, DiTStageError)(text))
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
