# SPDX-License-Identifier: Apache-2.0
"""The CPU default for `--dtype auto`: float32 where the CPU cannot compute in 16 bits natively.

vLLM resolves `auto` to the checkpoint's dtype (bfloat16 for most models). On an x86 CPU without
AVX512_BF16 or AMX every bfloat16 matmul and attention step converts to float32 and back, which
costs more than computing in float32 throughout. Measured on a 2-core AMD EPYC with AVX2 only
(`benchmarks/cpu_dtype.py`, tiny 8-layer Llama, PP=1; docs/results/cpu_dtype.json): a prefill
takes 4.6x as long in bfloat16 as in float32 at 512 tokens, 3.1x at 2K, 1.7x at 8K and 1.4x at
16K; the gap narrows as attention's share of the work grows. float16 is in the same position
without AVX512_FP16/AMX_FP16.

`auto_dtype` keeps vLLM's choice where the CPU has the instructions, on other architectures and
wherever the user named a dtype (vLLM only asks for `auto` when none was given).
"""

from __future__ import annotations

import functools
import platform

import torch

from vllm_omni.logger import init_logger

logger = init_logger(__name__)

# /proc/cpuinfo flags that give an x86 CPU native arithmetic in each 16-bit type.
NATIVE_FLAGS = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor listed in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


@functools.cache
def native_low_precision() -> frozenset[torch.dtype] | None:
    """The 16-bit dtypes this CPU computes natively; None where that is not known (not x86 Linux),
    in which case vLLM's choice stands."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo") as f:
            flags = cpu_flags(f.read())
    except OSError:
        return None
    return frozenset(d for d, names in NATIVE_FLAGS.items() if flags.intersection(names))


def auto_dtype(resolved: torch.dtype, native: frozenset[torch.dtype] | None) -> torch.dtype:
    """What `--dtype auto` should become on this CPU, given vLLM's resolution `resolved`."""
    if native is None or resolved not in NATIVE_FLAGS or resolved in native:
        return resolved
    return torch.float32


def resolved_on_this_cpu(checkpoint_dtype: torch.dtype) -> torch.dtype:
    """The dtype `--dtype auto` gives a checkpoint stored in `checkpoint_dtype` here (CPU)."""
    return auto_dtype(checkpoint_dtype, native_low_precision())


_warned: set[torch.dtype] = set()


def resolve_auto_dtype_on_cpu(resolved: torch.dtype) -> torch.dtype:
    chosen = resolved_on_this_cpu(resolved)
    if chosen != resolved and resolved not in _warned:
        _warned.add(resolved)
        name = str(resolved).removeprefix("torch.")
        logger.info(
            "vllm_omni: --dtype auto runs %s models in float32 on this CPU: it has no native %s "
            "arithmetic (%s), which makes %s slower than float32 here. Pass --dtype %s to keep it.",
            name, name, " / ".join(NATIVE_FLAGS[resolved]), name, name,
        )  # fmt: skip
    return chosen
