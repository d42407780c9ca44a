# SPDX-License-Identifier: Apache-2.0
"""CPURayExecutor: vLLM's own Ray executor (RayExecutorV2) on the CPU platform.

Stock vLLM 0.32 refuses Ray on CPU ("current platform cpu does not support ray"): its Ray code
places workers by the platform's accelerator resource ("GPU"), which a CPU has none of. This
subclass changes only that:

- every worker takes one unit of a custom Ray resource, `vllm_cpu`, which each node advertises
  once per worker it hosts (`ray start --resources '{"vllm_cpu": 2}'`);
- the placement group (one `vllm_cpu` bundle per rank) is made here, waited for at most
  `PLACEMENT_TIMEOUT_S` with an error naming the missing resource (vLLM waits 1800 s), and
  removed at shutdown, so nothing is left behind on the cluster;
- workers report no accelerator ids, and size torch's thread pool to their share of the node's
  CPUs (Ray starts actors with one OpenMP thread);
- shared memory is cleaned up: RayExecutorV2 ends workers with `ray.kill`, which skips the
  finalizer that unlinks the response queue of a worker on the driver's node (240 MiB of
  /dev/shm per engine start, measured), so those names are unlinked once both ends have mapped
  them; and `ray.init` in the engine-core process replaces vLLM's SIGTERM handler, which is put
  back so a terminated engine still shuts down in order.

Everything else - actors, message queues, torch.distributed between the PP stages, the
scheduler and worker classes (`scheduler_cls`, `worker_cls`: CPP's too) - is RayExecutorV2's.
The platform switches to this class by itself when the user asks for `ray` on CPU
(`--distributed-executor-backend ray`; `vllm_omni._patches`, patch 2), so nobody names it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from multiprocessing import resource_tracker
from typing import Any

import ray
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2, RayWorkerProc

from vllm_omni.logger import init_logger

logger = init_logger(__name__)

RAY_RESOURCE = "vllm_cpu"
"""The Ray resource a CPU worker occupies: one unit per rank."""
PLACEMENT_TIMEOUT_S = 120.0
# Set by the driver for its own machine; a worker on another node must not inherit them.
DRIVER_ONLY_ENV = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")


def threads_per_worker(node_resources: dict[str, float]) -> int:
    """The node's CPUs divided among the `vllm_cpu` slots it advertises (at least 1)."""
    slots = max(1, int(node_resources.get(RAY_RESOURCE, 1)))
    return max(1, int(node_resources.get("CPU", 1)) // slots)


def join_or_start_ray(runtime_env=None, cpu_slots: int = 1, num_cpus: float | None = None) -> bool:
    """Join the cluster of RAY_ADDRESS or the one running on this machine; with none, start a
    single-machine Ray offering `cpu_slots` `vllm_cpu` slots (and `num_cpus` CPUs, by default
    the machine's); True if it started one. Keeps the process's SIGTERM handler (vLLM's,
    uvicorn's), which `ray.init` replaces with a plain exit."""
    main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main_thread else None
    started = False
    try:
        ray.init(address="auto", runtime_env=runtime_env)
    except ConnectionError:
        if os.environ.get("RAY_ADDRESS"):
            raise  # the user named a cluster: do not quietly run without it
        logger.info("CPU Ray executor: no Ray cluster found, starting one on this machine")
        ray.init(runtime_env=runtime_env, num_cpus=num_cpus, resources={RAY_RESOURCE: cpu_slots})
        started = True
    if handler is not None:
        signal.signal(signal.SIGTERM, handler)
    return started


@contextlib.contextmanager
def cpu_ray_globals(resource: str, worker_proc: type) -> Iterator[None]:
    """`vllm_omni._patches` patch 5: the Ray device key and worker actor class RayExecutorV2
    reads, for CPU; restored on exit. Here rather than in `_patches`, which is above this module
    (it switches the platform to this executor: patch 2)."""
    from vllm.platforms import current_platform
    from vllm.v1.executor import ray_executor_v2

    saved = current_platform.ray_device_key, ray_executor_v2.RayWorkerProc
    current_platform.ray_device_key, ray_executor_v2.RayWorkerProc = resource, worker_proc
    try:
        yield
    finally:
        current_platform.ray_device_key, ray_executor_v2.RayWorkerProc = saved


def _unlink_attached(memory) -> None:
    """Unlink a shared-memory block this process attached to but did not create. vLLM attaches
    without registering it with multiprocessing's resource tracker, and `unlink` unregisters:
    register first, so the tracker's books stay balanced."""
    if memory is None:  # a worker on another node: its queue is a socket
        return
    resource_tracker.register(memory._name, "shared_memory")
    try:
        memory.unlink()
    except FileNotFoundError:
        resource_tracker.unregister(memory._name, "shared_memory")


class CPURayWorkerProc(RayWorkerProc):
    def get_node_and_physical_gpu_ids(self) -> tuple[str, list[int]]:
        return ray.get_runtime_context().get_node_id(), []

    def initialize_worker(
        self,
        local_rank: int,
        env_vars: dict[str, str],
        distributed_init_method: str,
        driver_env_vars: dict[str, str] | None = None,
        assigned_physical_gpu_ids: list[int] | None = None,
    ) -> None:
        import torch

        node_id = ray.get_runtime_context().get_node_id()
        node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
        # Before the CPU worker starts: it disables torch.set_num_threads once it runs.
        torch.set_num_threads(threads_per_worker(node["Resources"]))
        os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
        driver_env = {k: v for k, v in (driver_env_vars or {}).items() if k not in DRIVER_ONLY_ENV}
        super().initialize_worker(local_rank, env_vars, distributed_init_method, driver_env, None)


class CPURayExecutor(RayExecutorV2):
    uses_ray = True
    supports_pp = True

    def _init_executor(self) -> None:
        self._placement_group = None
        config = self.parallel_config
        if not ray.is_initialized():
            join_or_start_ray(config.ray_runtime_env, config.world_size)
        if config.placement_group is None and ray.util.get_current_placement_group() is None:
            config.placement_group = self._placement_group = self._make_placement_group()
        try:
            with cpu_ray_globals(RAY_RESOURCE, CPURayWorkerProc):
                super()._init_executor()
        except BaseException:
            self.shutdown()
            raise
        for queue in self.response_mqs:  # created by the workers, which ray.kill ends abruptly
            _unlink_attached(getattr(getattr(queue, "buffer", None), "shared_memory", None))
        logger.info(
            "CPU Ray executor: %d workers on %d node(s)",
            self.world_size,
            len({h.node_id for h in self.ray_worker_handles}),
        )

    def _make_placement_group(self):
        world_size = self.parallel_config.world_size
        available = ray.cluster_resources().get(RAY_RESOURCE, 0)
        if available < world_size:
            raise RuntimeError(
                f"distributed_executor_backend='ray' on CPU: the Ray cluster offers {available:g} "
                f"of the {world_size} '{RAY_RESOURCE}' resources this engine needs (one per "
                f"rank). Start each node with `ray start ... --resources "
                f"'{{\"{RAY_RESOURCE}\": N}}'` for the N ranks it should host."
            )
        group = ray.util.placement_group([{RAY_RESOURCE: 1.0}] * world_size, strategy="PACK")
        try:
            ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except BaseException:
            ray.util.remove_placement_group(group)
            raise
        return group

    @staticmethod
    def _get_actor_resource_kwargs() -> dict[str, Any]:
        return {"num_gpus": 0, "resources": {RAY_RESOURCE: 1}}

    def shutdown(self) -> None:
        broadcast = getattr(getattr(self, "rpc_broadcast_mq", None), "buffer", None)
        super().shutdown()
        if broadcast is not None and broadcast.is_creator:  # now, not whenever it is collected
            broadcast.is_creator = False
            with contextlib.suppress(FileNotFoundError):
                broadcast.shared_memory.unlink()
        group, self._placement_group = getattr(self, "_placement_group", None), None
        if group is not None and ray.is_initialized():
            ray.util.remove_placement_group(group)
