# SPDX-License-Identifier: Apache-2.0
"""The one way a benchmark writes its result file: the result and its provenance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import provenance


def write_result(
    path: Path | str | None, result: dict[str, Any], *, dtype: str | None = None
) -> dict[str, Any]:
    """`result` with a "provenance" entry, written as indented JSON to `path` (nothing is
    written when `path` is None). Returns what was (or would have been) written."""
    if "provenance" in result:
        raise ValueError("result: 'provenance' is written by write_result, not by the benchmark")
    out = {"provenance": provenance(dtype), **result}
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, default=_jsonable) + "\n")
        print(f"wrote {path}")
    return out


def _jsonable(value: Any) -> Any:
    """Paths, numpy scalars and tuples-as-keys' values: what benchmarks put in results."""
    if isinstance(value, Path):
        return str(value)
    item = getattr(type(value), "item", None)
    if callable(item):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
