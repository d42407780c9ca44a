# SPDX-License-Identifier: Apache-2.0
"""/metrics for the CPP cost model: which model the scheduler plans with and how well it fits.

The scheduler (engine core process) writes its `FitStatus` to `cpp.status_path`
(vllm_omni.cpp.online_fit); this collector, registered in the API server's process by
`cpp_engine_args`, reads that file on each scrape:

- `vllm_omni:cpp_cost_model_info{source=...}` 1 for the source planned with (online, cached,
  file, analytic);
- `vllm_omni:cpp_cost_model_fit_relative_rmse`, `..._fit_steps`, `..._fit_outliers`;
- `vllm_omni:cpp_cost_model_coefficient{term=...}` in seconds (FLOPs for the analytic model).
"""

from __future__ import annotations

import atexit
import json
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric

TERMS = ("step_overhead", "linear", "attention", "context")


class CostModelCollector:
    def __init__(self) -> None:
        self.status_path: Path | None = None

    def describe(self) -> list[Metric]:
        return []  # else the registry collects once at registration, before any status exists

    def collect(self) -> Iterator[Metric]:
        try:
            status = json.loads(self.status_path.read_text()) if self.status_path else None
        except (OSError, ValueError):
            status = None
        if not status:
            return
        info = GaugeMetricFamily(
            "vllm_omni:cpp_cost_model_info",
            "The CPP scheduler's cost model: 1 for the source it plans with",
            labels=["source", "unit"],
        )
        info.add_metric([status["source"], status["model"]["unit"]], 1)
        yield info
        coefficient = GaugeMetricFamily(
            "vllm_omni:cpp_cost_model_coefficient",
            "Cost model terms per stage: step overhead, per token, per token x context pair, "
            "per cached token of a chunk (seconds, or FLOPs for the analytic model)",
            labels=["term"],
        )
        for term in TERMS:
            coefficient.add_metric([term], status["model"].get(term, 0.0))
        yield coefficient
        for key, name, doc in (
            ("rel_rmse", "fit_relative_rmse", "Relative RMS error of the online fit's steps"),
            ("num_steps", "fit_steps", "Steps the online fit used"),
            ("outliers", "fit_outliers", "Steps the latest online fit left out as outliers"),
        ):
            if status.get(key) is not None:
                yield GaugeMetricFamily(f"vllm_omni:cpp_cost_model_{name}", doc, status[key])


_collector: CostModelCollector | None = None


def install(status_path: str | Path) -> None:
    """Report the status the scheduler writes to `status_path` (the last installed engine's)."""
    global _collector
    if _collector is None:
        _collector = CostModelCollector()
        REGISTRY.register(_collector)
    _collector.status_path = Path(status_path)
    # The engine core may be killed before its scheduler can remove the file.
    atexit.register(Path(status_path).unlink, missing_ok=True)
