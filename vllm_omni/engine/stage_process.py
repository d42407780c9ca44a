# SPDX-License-Identifier: Apache-2.0
"""Where a DiT stage's loop runs: a local process, or a Ray actor placed by resources.

Both run `vllm_omni.diffusion.engine_core.run_dit_stage` and hand the orchestrator the same
thing: an inbox to put messages into, an outbox to read from, and whether the loop still runs.
On Ray the queues are `ray.util.queue.Queue`s and a request's tensors travel as one object ref
(put once by the orchestrator, fetched by the actor from the object store, wherever it runs).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping
from typing import Any

from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.engine_core import run_dit_stage

STOP_TIMEOUT_S = 10.0


class LocalStageProcess:
    backend = "local"

    def __init__(self, name: str, config: DiTConfig, mode: str, executor: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self._process = ctx.Process(
            target=run_dit_stage,
            args=(config, mode, executor, self.inbox, self.outbox),
            name=f"DiTStage-{name}",
            daemon=True,
        )
        self._process.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def is_alive(self) -> bool:
        return self._process.is_alive()

    def death(self) -> str:
        return f"process died (exit code {self._process.exitcode})"

    def pack(self, arrays: dict[str, Any]) -> Any:
        return arrays

    def stop(self) -> None:
        self.inbox.put(("shutdown", None, None))
        self._process.join(timeout=STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self.outbox.put(None)  # wakes the reader

    def close(self) -> None:
        # Unlink the queues' semaphores now, by dropping the last references to them.
        # multiprocessing would at interpreter exit, but uvicorn ends a server by re-raising the
        # SIGTERM it got, which skips that: Python's resource tracker then reports them leaked.
        for q in (self.inbox, self.outbox):
            q.close()
            q.join_thread()


class _Inbox:
    """The actor's side of the inbox: fetches a request's tensors from the object store."""

    def __init__(self, queue) -> None:
        self._queue = queue

    def get(self, block: bool = True, timeout: float | None = None):
        import ray

        kind, key, payload = self._queue.get(block=block, timeout=timeout)
        if kind == "add":
            ref, params = payload
            payload = (ray.get(ref), params)
        return kind, key, payload

    def get_nowait(self):
        return self.get(block=False)


class DiTStageActor:
    """The Ray actor a DiT stage runs in (wrapped by `ray.remote` at placement)."""

    def run(self, config: DiTConfig, mode: str, executor: str, inbox, outbox) -> None:
        run_dit_stage(config, mode, executor, _Inbox(inbox), outbox)


class RayStageProcess:
    """The stage loop in a Ray actor. `resources`: Ray resources the actor needs ("CPU", "GPU"
    or custom names), which decide the node it runs on."""

    backend = "ray"

    def __init__(
        self,
        name: str,
        config: DiTConfig,
        mode: str,
        executor: str,
        resources: Mapping[str, float],
    ) -> None:
        import ray
        from ray.util.queue import Queue

        if not ray.is_initialized():
            from vllm_omni.executor.cpu_ray import join_or_start_ray

            # Without a cluster, one on this machine, with CPU slots for AR stages' workers.
            join_or_start_ray(cpu_slots=os.cpu_count() or 1)
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        options = dict(
            name=f"vllm_omni-stage-{name}-{id(self):x}",
            num_cpus=resources.get("CPU", 1),
            num_gpus=resources.get("GPU", 0),
            resources=custom,
            max_restarts=0,
        )
        # The queues run as small actors of their own, next to the orchestrator.
        self.inbox, self.outbox = Queue(), Queue()
        self.actor = ray.remote(DiTStageActor).options(**options).remote()
        self._run = self.actor.run.remote(config, mode, executor, self.inbox, self.outbox)
        self.pid = None  # not a local process

    @property
    def is_alive(self) -> bool:
        import ray

        ready, _ = ray.wait([self._run], timeout=0)
        return not ready  # the loop's call returns only when the loop ends or the actor dies

    def death(self) -> str:
        import ray

        try:
            ray.get(self._run, timeout=0)
        except Exception as e:  # RayActorError, or the loop's own exception
            return f"Ray actor died ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        return "Ray actor ended"

    def pack(self, arrays: dict[str, Any]) -> Any:
        import ray

        return ray.put(arrays)

    def stop(self) -> None:
        import ray

        if self.is_alive:
            self.inbox.put(("shutdown", None, None))
            ready, _ = ray.wait([self._run], timeout=STOP_TIMEOUT_S)
            if not ready:
                ray.kill(self.actor)
        self.outbox.put(None)  # wakes the reader

    def close(self) -> None:
        import ray

        for handle in (self.actor, self.inbox.actor, self.outbox.actor):
            ray.kill(handle)


def start_stage_process(
    name: str,
    config: DiTConfig,
    mode: str,
    executor: str,
    backend: str,
    resources: Mapping[str, float],
) -> LocalStageProcess | RayStageProcess:
    if backend == "ray":
        return RayStageProcess(name, config, mode, executor, resources)
    return LocalStageProcess(name, config, mode, executor)
