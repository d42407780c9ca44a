# SPDX-License-Identifier: Apache-2.0
"""Benchmarks are scripts, not a package: tests load them by path, one way."""

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def load_benchmark(name: str) -> Iterator[ModuleType]:
    """benchmarks/<name>.py as a module, with benchmarks/ on the path while it is in use (the
    scripts import each other as siblings) and itself in sys.modules (dataclasses look their
    module up there)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(BENCHMARKS))
