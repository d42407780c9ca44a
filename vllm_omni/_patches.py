# SPDX-License-Identifier: Apache-2.0
"""Every patch of vLLM internals that vllm_omni makes, in one place.

Patches are a last resort: each one below says WHY it exists, its SCOPE, and when to REMOVE it.
`apply()` runs only from the vLLM plugin entry point (`vllm_omni.plugin.register`), never on import.
Each patch pins a fingerprint of the vLLM function it wraps; a changed function is not patched and
`tests/test_patches.py` fails, so a vLLM upgrade forces a review of every patch.

1. cpu_pp_eager_buffer - `CPUModelRunner.load_model`
   WHY: with PP>1 and `enforce_eager=True`, the CPU runner skips the warm-up dummy run that
        allocates the buffer for received intermediate tensors, so the first step on a non-first
        PP rank fails with `assert self.intermediate_tensors is not None`.
   SCOPE: CPU backend, V1 model runner, non-first PP ranks; allocates the same buffer the dummy run
        would (`make_empty_intermediate_tensors` for `max_num_tokens`).
   REMOVE: when vLLM's CPU runner allocates that buffer without a compiled warm-up.

2. cpu_startup_defaults - `CpuPlatform.check_and_update_config`
   WHY: on a single-NUMA machine PP>1 dies with "Not enough allowed NUMA nodes" under the default
        thread binding, and the default memory utilisation over-commits the node with 2+ workers;
        glibc's malloc returns each step's activations to the system (CPP steps 7-10% slower).
   SCOPE: CPU platform; fills `VLLM_CPU_OMP_THREADS_BIND`, `kv_cache_memory_bytes` and glibc's
        `MALLOC_*` variables only where the user set nothing (`vllm_omni.platform.cpu_defaults`).
        Also turns `distributed_executor_backend="ray"`, which vLLM's CPU platform cannot run,
        into `vllm_omni.executor.cpu_ray.CPURayExecutor` (vLLM's RayExecutorV2 for CPU workers).
   REMOVE: when vLLM picks working defaults for several local CPU workers itself, and runs Ray
        on CPU.

3. cpp_batch_queue_depth - `VllmConfig.max_concurrent_batches`
   WHY: with PP and synchronous scheduling, vLLM keeps exactly pp_size steps in flight, so the
        first stage, done with its chunk, waits for the last stage to finish the oldest step and
        for the engine to schedule the next one before it can start again. CPP schedules
        `cpp.lookahead_steps` more steps ahead, so that step is already queued.
   SCOPE: engines with `additional_config["cpp"]`, PP>1, no async scheduling; everything else
        gets vLLM's value unchanged. All platforms.
   REMOVE: when vLLM lets the batch-queue depth be configured (or schedules PP steps ahead).

4. cpu_auto_dtype - `vllm.config.model._resolve_auto_dtype`
   WHY: `--dtype auto` takes the checkpoint's bfloat16 even on x86 CPUs without AVX512_BF16/AMX,
        where every bf16 kernel converts to float32 and back: prefill 1.4x (16K tokens) to 4.6x
        (512) slower than in float32 on an AVX2-only EPYC (`benchmarks/cpu_dtype.py`).
   SCOPE: CPU platform, x86 Linux, `--dtype auto` only (an explicit dtype never reaches this
        function); bfloat16/float16 become float32 where the CPU lacks that type's instructions
        (`vllm_omni.platform.cpu_dtype`).
   REMOVE: when vLLM's CPU platform lists only natively supported 16-bit dtypes.

5. cpu_ray_executor - `current_platform.ray_device_key`, `ray_executor_v2.RayWorkerProc`
   WHY: RayExecutorV2._init_executor refuses a platform without a Ray device key (CPU's is "")
        and creates its worker actors from the module-level `RayWorkerProc`, which asks Ray for
        GPU ids; CPU workers need a custom resource and no accelerator ids.
   SCOPE: only while `CPURayExecutor._init_executor` runs (`cpu_ray_globals`, which lives in
        `vllm_omni.executor.cpu_ray`; restored after),
        in the engine-core process of an engine that asked for Ray on CPU. Not a wrapper, so
        the functions that read these two globals are pinned instead (`all_pinned`).
   REMOVE: when vLLM's Ray executor supports the CPU platform.

6. cpu_shm_reader_nap - `shm_broadcast.SpinCondition.wait`
   WHY: a reader of vLLM's shared-memory message queues (a worker waiting for the next step, the
        engine core waiting for a step's output) spins on `sched_yield` for 1 s after every
        read. On a CPU the spinning process takes cores from the model's own threads: the tiny
        Qwen-Image server's text-encoder worker burnt 8-17 s of CPU in a 19 s trace (160
        encodes of ~5 ms), and the DiT process beside it slowed by up to 10x in some runs.
   SCOPE: CPU platform, every reader. It still spins for the first `SHM_SPIN_S` (20 ms) after a
        read (back-to-back steps keep the fast path); for the rest of vLLM's busy window it sleeps
        on the queue's notification socket, at most `SHM_NAP_MS` at a time (vLLM's readers can
        miss a notification and recheck only every 5 s: seen as 4 s stalls with no spin at
        all); past the window, vLLM's own idle wait.
   REMOVE: when vLLM's spin time can be configured, or its readers stop spinning on CPU.

7. cpu_shm_unlink - `cpu_communicator._CPUSHMDistributed._init_cpu_shm`
   WHY: the CPU communicator of a PP (or TP) group makes one POSIX shared-memory segment per
        rank (`/dev/shm/<group>-cpushm_<rank>`, a few MB each) and unlinks them only when a
        worker exits in order; workers ended by a signal leave them behind, so /dev/shm filled
        up by ~30 MB per `make test` and by more on a host that restarts servers.
   SCOPE: CPU platform, every group that uses the shared-memory collectives. After vLLM's own
        set-up, whose last barrier is passed once every rank has mapped every segment, the
        group's names are unlinked (`unlink_cpu_shm`); the mappings stay valid and the memory
        goes back to the system when the last rank unmaps it, however it ends.
   REMOVE: when vLLM unlinks these segments once its ranks have joined them.

8. tokenizer_folder_config - `vllm.tokenizers.registry.get_config`
   WHY: vLLM's tokenizer loader first tries to read a model config from the tokenizer's folder
        (and ignores the failure); `get_config` retries a failed parse after sleeping 2 s, for a
        hub cache refreshing under it. A diffusers checkpoint keeps its tokenizer in a folder of
        its own with no `config.json` (Qwen-Image's, Z-Image's `tokenizer/`), so every engine of
        such a stage slept 2 s in the server process and 2 s in its engine core, and logged two
        "Error parsing config" ERROR lines a user took for a failure.
   SCOPE: the tokenizer loader's call only (the name bound in `vllm.tokenizers.registry`), all
        platforms; a local folder with neither `config.json` nor `params.json` fails at once
        with the ValueError the loader ignores; any other path goes to vLLM's `get_config`.
   REMOVE: when vLLM's tokenizer loader skips folders without a model config (or stops retrying
        local ones).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_omni.logger import init_logger

logger = init_logger(__name__)


@dataclass(frozen=True)
class Patch:
    name: str
    owner: type | types.ModuleType
    attr: str
    fingerprint: str
    """First 12 hex digits of sha256 over the source of the vLLM function being wrapped."""
    make_wrapper: Callable[[Callable], Callable]
    kind: str = "function"
    """How the attribute is bound: "function", "classmethod" or "property" (its getter)."""
    cpu_only: bool = True

    def _unwrapped(self) -> Callable:
        fn = inspect.getattr_static(self.owner, self.attr)
        if isinstance(fn, classmethod):
            return fn.__func__
        return fn.fget if isinstance(fn, property) else fn

    def original(self) -> Callable:
        fn = self._unwrapped()
        return getattr(fn, "__vllm_omni_original__", fn)

    def current_fingerprint(self) -> str:
        return source_fingerprint(self.original())

    def is_applied(self) -> bool:
        return hasattr(self._unwrapped(), "__vllm_omni_original__")

    def apply(self) -> bool:
        if self.is_applied():
            return True
        if self.current_fingerprint() != self.fingerprint:
            logger.warning(
                "vllm_omni: not applying patch %s: %s.%s changed in this vLLM (fingerprint %s, "
                "expected %s)",
                self.name,
                getattr(self.owner, "__qualname__", self.owner.__name__),
                self.attr,
                self.current_fingerprint(),
                self.fingerprint,
            )
            return False
        original = self.original()
        wrapper = functools.wraps(original)(self.make_wrapper(original))
        wrapper.__vllm_omni_original__ = original
        bind = {"function": lambda f: f, "classmethod": classmethod, "property": property}
        setattr(self.owner, self.attr, bind[self.kind](wrapper))
        return True


def source_fingerprint(fn: Callable) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:12]


def _wrap_cpu_load_model(original: Callable) -> Callable:
    def load_model(self, *args, **kwargs):
        original(self, *args, **kwargs)
        from vllm.distributed.parallel_state import get_pp_group

        if not get_pp_group().is_first_rank and self.intermediate_tensors is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device
            )

    return load_model


def _wrap_cpu_check_and_update_config(original: Callable) -> Callable:
    def check_and_update_config(cls, vllm_config):
        original(cls, vllm_config)
        from vllm_omni.platform.cpu_defaults import apply_cpu_defaults

        apply_cpu_defaults(vllm_config)

    return check_and_update_config


def _wrap_max_concurrent_batches(original: Callable) -> Callable:
    def max_concurrent_batches(self) -> int:
        depth = original(self)
        from vllm_omni.cpp.config import CPPConfig

        cpp = CPPConfig.from_additional_config(self.additional_config)
        pp_size = self.parallel_config.pipeline_parallel_size
        if cpp is None or pp_size == 1 or self.scheduler_config.async_scheduling:
            return depth
        return max(depth, pp_size + cpp.lookahead_steps)

    return max_concurrent_batches


def _wrap_resolve_auto_dtype(original: Callable) -> Callable:
    def resolve_auto_dtype(*args, **kwargs):
        from vllm_omni.platform.cpu_dtype import resolve_auto_dtype_on_cpu

        return resolve_auto_dtype_on_cpu(original(*args, **kwargs))

    return resolve_auto_dtype


SHM_SPIN_S = 0.02
"""Patch 6: how long a queue reader spins after a read before it sleeps on the socket. 20 ms:
the tiny Qwen2.5-Omni pipeline answered one request in 0.41-0.43 s with it, 0.44-0.50 s with 5 ms
and 0.39-0.44 s with vLLM's 1 s; the Qwen-Image text encoder's worker used 0.9 s of CPU in the
19 s trace with 5 or 20 ms, 2.5 s with 50 ms and 10.5 s with 1 s."""
SHM_NAP_MS = 10
"""Patch 6: the longest single sleep of a reader inside vLLM's busy window."""


def _wrap_shm_wait(original: Callable) -> Callable:
    def wait(self, timeout_ms: int | None = None) -> None:
        idle_s = time.monotonic() - self.last_read
        if not SHM_SPIN_S < idle_s <= self.busy_loop_s:
            return original(self, timeout_ms)  # spinning briefly, or vLLM's idle mode
        nap_ms = SHM_NAP_MS if timeout_ms is None else min(timeout_ms, SHM_NAP_MS)
        busy_loop_s, self.busy_loop_s = self.busy_loop_s, 0.0  # take vLLM's sleeping branch
        try:
            return original(self, nap_ms)
        finally:
            self.busy_loop_s = busy_loop_s

    return wait


SHM_DIR = "/dev/shm"
"""Where POSIX shared-memory names live on Linux (patch 7)."""


def unlink_cpu_shm(group_name: str) -> list[str]:
    """Patch 7: unlink a CPU communicator group's segments (`<group_name>_<rank>`); returns the
    names unlinked. Another rank may unlink a name first: that is fine."""
    import glob
    import os

    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(group_name) + "_*")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(os.path.basename(path))
    return removed


def _wrap_init_cpu_shm(original: Callable) -> Callable:
    def _init_cpu_shm(self) -> int:
        handle = original(self)  # ends with a barrier: every rank has joined every segment
        unlink_cpu_shm(self.group_name)
        return handle

    return _init_cpu_shm


MODEL_CONFIG_FILES = ("config.json", "params.json")
"""What vLLM reads a model config from (HF's, Mistral's)."""


def _wrap_tokenizer_get_config(original: Callable) -> Callable:
    def get_config(model, *args, **kwargs):
        folder = Path(model)
        if folder.is_dir() and not any((folder / name).is_file() for name in MODEL_CONFIG_FILES):
            raise ValueError(f"{model}: a tokenizer folder with no model config")
        return original(model, *args, **kwargs)

    return get_config


def all_patches() -> list[Patch]:
    import vllm.config.model
    from vllm.config import VllmConfig
    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm.platforms.cpu import CpuPlatform
    from vllm.tokenizers import registry as tokenizer_registry
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    return [
        Patch(
            "cpu_pp_eager_buffer",
            CPUModelRunner,
            "load_model",
            "270bdfc6670d",
            _wrap_cpu_load_model,
        ),
        Patch(
            "cpu_startup_defaults",
            CpuPlatform,
            "check_and_update_config",
            "d2960ad5d183",
            _wrap_cpu_check_and_update_config,
            kind="classmethod",
        ),
        Patch(
            "cpp_batch_queue_depth",
            VllmConfig,
            "max_concurrent_batches",
            "134b00e18e9f",
            _wrap_max_concurrent_batches,
            kind="property",
            cpu_only=False,
        ),
        Patch(
            "cpu_auto_dtype",
            vllm.config.model,
            "_resolve_auto_dtype",
            "fe04784e85b5",
            _wrap_resolve_auto_dtype,
        ),
        Patch(
            "cpu_shm_reader_nap",
            SpinCondition,
            "wait",
            "3c5dd220ba84",
            _wrap_shm_wait,
        ),
        Patch(
            "cpu_shm_unlink",
            _CPUSHMDistributed,
            "_init_cpu_shm",
            "f48239fe4f18",
            _wrap_init_cpu_shm,
        ),
        Patch(
            "tokenizer_folder_config",
            tokenizer_registry,
            "get_config",
            "45551a5f8f7e",
            _wrap_tokenizer_get_config,
            cpu_only=False,
        ),
    ]


def cpu_ray_globals(resource: str, worker_proc: type) -> contextlib.AbstractContextManager[None]:
    """Patch 5: the Ray device key and worker actor class RayExecutorV2 reads, for CPU. Listed
    here with the other patches; it lives with its only user, `vllm_omni.executor.cpu_ray`,
    which sits below this module and must not import it (tests/test_layering.py)."""
    from vllm_omni.executor.cpu_ray import cpu_ray_globals

    return cpu_ray_globals(resource, worker_proc)


def apply() -> dict[str, bool]:
    """Apply every patch that still fits the installed vLLM; returns {name: applied}."""
    from vllm.platforms import current_platform

    is_cpu = current_platform.is_cpu()
    return {p.name: p.apply() for p in all_patches() if is_cpu or not p.cpu_only}


# ---------------------------------------------------------------------------------- pinned
# Not patches: vLLM (and diffusers) internals that vllm_omni wraps on instances it owns (one
# worker's model runner, one engine's output processor, one DiT stage's VAE), leaving the classes
# untouched. Their behaviour is still assumed, so each is fingerprinted like a patch and
# tests/test_patches.py fails when vLLM or diffusers changes it.


@dataclass(frozen=True)
class Pinned:
    owner: type
    attr: str
    fingerprint: str
    why: str

    def current_fingerprint(self) -> str:
        return source_fingerprint(getattr(self.owner, self.attr))


def all_pinned() -> list[Pinned]:
    """These, and what each model family relies on (its `pinned`)."""
    from vllm_omni.registry import families

    return _library_pinned() + [
        pin for family in families().values() if family.pinned for pin in family.pinned()
    ]


def _library_pinned() -> list[Pinned]:
    from vllm.distributed.device_communicators.shm_broadcast import ShmRingBuffer
    from vllm.model_executor.models.interfaces import SupportsEagle3
    from vllm.tokenizers import registry as tokenizer_registry
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.executor import ray_utils
    from vllm.v1.executor.ray_executor_v2 import RayExecutorV2, RayWorkerProc
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return [
        Pinned(
            tokenizer_registry,
            "get_tokenizer",
            "20feb2c9ca50",
            "patch 8: it reads a model config from the tokenizer's path and ignores a "
            "ValueError or OSError from `get_config`.",
        ),
        Pinned(
            RayExecutorV2,
            "_init_executor",
            "2852d4ccf3e2",
            "patch 5 (executor.cpu_ray): it creates worker actors from the module-level "
            "RayWorkerProc, with the resources of `_get_actor_resource_kwargs`, and takes an "
            "existing `parallel_config.placement_group`.",
        ),
        Pinned(
            ray_utils,
            "initialize_ray_cluster",
            "7afb10e0efaf",
            "patch 5: it refuses a platform whose `ray_device_key` is empty, and with a "
            "placement group given, only checks its bundles for that key.",
        ),
        Pinned(
            RayWorkerProc,
            "get_node_and_physical_gpu_ids",
            "ae2a768ce40e",
            "executor.cpu_ray overrides it: it looks up accelerator ids, which CPU workers lack.",
        ),
        Pinned(
            RayWorkerProc,
            "initialize_worker",
            "fcb829e0a388",
            "executor.cpu_ray sizes torch's threads before it and filters its driver env vars.",
        ),
        Pinned(
            RayExecutorV2,
            "shutdown",
            "30557010ffde",
            "executor.cpu_ray: it ends workers with ray.kill and leaves the broadcast queue's "
            "shared memory to the garbage collector, which CPURayExecutor unlinks itself.",
        ),
        Pinned(
            ShmRingBuffer,
            "__del__",
            "7183922f2ac3",
            "executor.cpu_ray: only the creator unlinks (`is_creator`, `shared_memory`).",
        ),
        Pinned(
            GPUModelRunner,
            "_model_forward",
            "a8f98588a465",
            "worker hooks (hidden states, per-token conditioning) wrap it on the runner: it "
            "runs the model on the batch in `input_batch.req_ids` order, with `input_ids` as a "
            "keyword argument.",
        ),
        Pinned(
            GPUModelRunner,
            "sample_tokens",
            "047e6a4738de",
            "worker.hidden_states fills `pooler_output` of the ModelRunnerOutput it returns "
            "(synchronous scheduling), aligned with `req_ids` and `sampled_token_ids`.",
        ),
        Pinned(
            GPUModelRunner,
            "_dummy_run",
            "47b96b71fc65",
            "worker.hidden_states (a hook that captures a decoder layer) sets "
            "`use_aux_hidden_state_outputs` after the model loads: the profiling and warm-up "
            "runs unpack the model's (hidden states, auxiliary hidden states) by that flag.",
        ),
        Pinned(
            SupportsEagle3,
            "set_aux_hidden_state_layers",
            "1bab1645ae9e",
            "worker.hidden_states has the model return one layer's output through it.",
        ),
        Pinned(
            OutputProcessor,
            "process_outputs",
            "9e116796002e",
            "engine.hidden_states_tap wraps it per engine: an output with a pooling tensor is "
            "taken as a pooling request's, so the tap removes the rows of generation outputs.",
        ),
    ]
