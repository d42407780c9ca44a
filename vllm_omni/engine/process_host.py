# SPDX-License-Identifier: Apache-2.0
"""Where a DiT stage's loop runs: a local process, or a Ray actor placed by resources.

Both run `vllm_omni.diffusion.engine_core.run_dit_stage` and hand the orchestrator the same
thing: an inbox to put messages into, an outbox to read from, and whether the loop still runs.
On Ray the queues are `ray.util.queue.Queue`s and a request's tensors travel as one object ref
(put once by the orchestrator, fetched by the actor from the object store, wherever it runs).

Also what every stage on Ray shares (AR stages' actors too, vllm_omni.engine.ray_ar_stage):
joining or starting Ray, the actor's options, and waiting until Ray has placed it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Mapping
from typing import Any

from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.engine_core import run_dit_stage

STOP_TIMEOUT_S = 10.0
PLACEMENT_TIMEOUT_S = 120.0
"""How long a stage's actor may wait for a node with the resources it asks for (Ray would wait
forever, and a stage that never starts looks like a slow one)."""


FORWARDED_ENV_PREFIXES = ("VLLM_", "HF_")
"""Environment variables a stage's actor takes from the orchestrator: Ray starts actors with the
environment of the node's raylet, so vLLM's and Hugging Face's settings (offline mode, CPU KV
cache space, ...) would otherwise not reach a stage on Ray."""


_joining = threading.Lock()
_started_ray = False  # whether join_ray started this process's Ray (then leave_ray stops it)


def join_ray(num_cpus: float = 0) -> None:
    """Join the cluster of RAY_ADDRESS or this machine's; with none, start one here, with
    `vllm_cpu` slots for AR stages' workers on Ray and at least `num_cpus` logical CPUs (what
    the graph's stage actors ask for: Ray's CPUs are bookkeeping, and a graph that fits on this
    machine's processes should fit on its Ray). Stages start in parallel (AR stages on
    threads): one of them joins, the others wait for it."""
    import ray

    from vllm_omni.executor.cpu_ray import join_or_start_ray

    global _started_ray
    with _joining:
        if not ray.is_initialized():
            cores = os.cpu_count() or 1
            _started_ray = join_or_start_ray(cpu_slots=cores, num_cpus=max(cores, num_cpus))


def leave_ray() -> None:
    """Stop the Ray that join_ray started, once the stages are down. Ray would at interpreter
    exit, but uvicorn ends a server by re-raising the SIGTERM it got, which skips that: Ray's
    head processes die with the driver and leave their agents running."""
    global _started_ray
    with _joining:
        if _started_ray:
            import ray

            ray.shutdown()
            _started_ray = False


def wait_placed(actor, stage: str, resources: Mapping[str, float]) -> dict[str, Any]:
    """Wait until Ray has placed a stage's actor; returns its `ready()` (pid and node id)."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(actor.ready.remote(), timeout=PLACEMENT_TIMEOUT_S)
    except GetTimeoutError:
        ray.kill(actor)
        free = {
            k: round(v, 2)
            for k, v in ray.available_resources().items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")
        }
        raise RuntimeError(
            f"resources: no Ray node placed stage {stage!r}'s actor within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s; it asks for {dict(resources)}, the cluster has {free} "
            f"free. Ask for less (the stage's `resources`) or add nodes"
        ) from None


def actor_location() -> dict[str, Any]:
    import ray

    return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


def actor_options(name: str, resources: Mapping[str, float], token: int) -> dict[str, Any]:
    """Ray options of a stage's actor: named (one per stage instance), placed by `resources`,
    never restarted (the requests it held fail instead)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    return dict(
        name=f"vllm_omni-stage-{name}-{token:x}",
        num_cpus=resources.get("CPU", 1),
        num_gpus=resources.get("GPU", 0),
        resources={k: v for k, v in resources.items() if k not in ("CPU", "GPU")},
        max_restarts=0,
        runtime_env={"env_vars": env},
    )


class LocalStageProcess:
    backend = "local"

    def __init__(self, name: str, config: DiTConfig, mode: str, executor: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self._process = ctx.Process(
            target=run_dit_stage,
            args=(config, mode, executor, self.inbox, self.outbox),
            name=f"ProcessStage-{name}",
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


class ProcessStageActor:
    """The Ray actor a DiT stage runs in (wrapped by `ray.remote` at placement)."""

    def ready(self) -> dict[str, Any]:
        return actor_location()

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

        join_ray()
        options = actor_options(name, resources, id(self))
        # The queues run as small actors of their own, next to the orchestrator.
        self.inbox, self.outbox = Queue(), Queue()
        self.actor = ray.remote(ProcessStageActor).options(**options).remote()
        self.placement = wait_placed(self.actor, name, resources)
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
