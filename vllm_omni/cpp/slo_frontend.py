# SPDX-License-Identifier: Apache-2.0
"""The API server's side of SLO-aware scheduling: SLO metrics on /metrics, admission control.

The CPP scheduler (engine core process) publishes its SLOLedger as a snapshot file
(vllm_omni.cpp.slo_ledger). In the API server process, `install` - called by `cpp_engine_args`
when `cpp.slo` is on - registers one Prometheus collector that reads the snapshot on each scrape,
and arms the admission check that `SLOParamsValidator.validate_params` runs for every request:
with `cpp.admission`, a request whose TTFT SLO cannot be met gets HTTP 429 before it reaches
the engine.

"Cannot be met" means: the prefill work already queued with an earlier TTFT deadline, in the
calibrated cost model's seconds, less the time since the snapshot, exceeds the SLO. The request's
own prefill is not counted (vLLM validates sampling parameters before it tokenizes the prompt),
nor that the scheduler serves smaller prefills first: a request shorter than the queued work can
overtake it, so the check may refuse a short request that would have made its SLO.

Limits: one CPP engine per API server process (the last installed one answers); vLLM's
multi-process metrics mode (--api-server-count > 1) does not read this collector.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from vllm.exceptions import GracefulHTTPError

from vllm_omni.cpp.slo import TTFT_SLO_ARG, SLOTargets, request_slo
from vllm_omni.cpp.slo_ledger import SLACK_BUCKETS_S, read_snapshot

SNAPSHOT_CACHE_S = 0.02
"""Requests arriving together share one read of the snapshot."""


class SLOAdmissionError(GracefulHTTPError):
    """HTTP 429: the request's TTFT SLO cannot be met with the work already queued."""

    def __init__(self, message: str) -> None:
        super().__init__(message, HTTPStatus.TOO_MANY_REQUESTS)


@dataclass(eq=False)  # a Prometheus collector: registries hash it
class SLOFrontend:
    ledger_path: Path
    defaults: SLOTargets
    admission: bool
    rejected: int = 0
    _snapshot: dict[str, Any] | None = None
    _read_at: float = -1.0

    def snapshot(self) -> dict[str, Any] | None:
        now = time.monotonic()
        if now - self._read_at > SNAPSHOT_CACHE_S:
            self._snapshot, self._read_at = read_snapshot(self.ledger_path), now
        return self._snapshot

    def queued_ahead_s(self, deadline: float, now: float) -> float:
        """Prefill work (s) queued with a TTFT deadline no later than `deadline`."""
        snapshot = self.snapshot()
        if not snapshot:
            return 0.0
        ahead = sum(
            cost for due, cost in snapshot["backlog"] if due is not None and due <= deadline
        )
        return max(0.0, ahead - max(0.0, now - snapshot["time"]))

    def admit(self, extra_args: Mapping[str, Any] | None) -> None:
        """Raises SLOAdmissionError (HTTP 429) when the request's TTFT SLO cannot be met."""
        if not self.admission:
            return
        ttft_s = request_slo(extra_args, self.defaults).ttft_s
        if ttft_s is None:
            return
        now = time.time()
        wait_s = self.queued_ahead_s(now + ttft_s, now)
        if wait_s > ttft_s:
            self.rejected += 1
            raise SLOAdmissionError(
                f"vllm_xargs.{TTFT_SLO_ARG}: a TTFT SLO of {ttft_s * 1000:g} ms cannot be met, "
                f"about {wait_s:.2f} s of prefill work with earlier deadlines is queued; "
                "retry later or with a looser SLO"
            )

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot() or {}
        for kind, unit in (("ttft", "requests"), ("tpot", "decode steps")):
            stats = snapshot.get(kind)
            outcomes = CounterMetricFamily(
                f"vllm_omni:slo_{kind}",
                f"{kind.upper()} SLO outcomes ({unit}), measured in the engine core",
                labels=["outcome"],
            )
            slack = HistogramMetricFamily(
                f"vllm_omni:slo_{kind}_slack_seconds",
                f"{kind.upper()} SLO minus the measured {kind.upper()} ({unit}; < 0: missed)",
            )
            if stats:
                outcomes.add_metric(["met"], stats["met"])
                outcomes.add_metric(["missed"], stats["missed"])
                cumulative, buckets = 0, []
                for bound, count in zip((*SLACK_BUCKETS_S, float("inf")), stats["counts"]):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
                # Slack can be negative, so Prometheus has no _sum (the count is le="+Inf").
                slack.add_metric([], buckets, sum_value=None)
            yield outcomes
            yield slack
        backlog = GaugeMetricFamily(
            "vllm_omni:slo_prefill_backlog_seconds",
            "Prefill work queued in the scheduler, in the calibrated cost model's seconds",
        )
        backlog.add_metric([], sum(cost for _, cost in snapshot.get("backlog", [])))
        yield backlog
        rejected = CounterMetricFamily(
            "vllm_omni:slo_admission_rejected",
            "Requests refused with HTTP 429 because their TTFT SLO could not be met",
        )
        rejected.add_metric([], self.rejected)
        yield rejected


class _Collector:
    """Registered once per process; reports for the frontend installed last."""

    def describe(self) -> list[Metric]:
        return []  # else the registry collects once at registration, before any snapshot

    def collect(self) -> Iterator[Metric]:
        if _active is not None:
            yield from _active.collect()


_active: SLOFrontend | None = None
_collector: _Collector | None = None


def install(ledger_path: str | Path, defaults: SLOTargets, admission: bool) -> SLOFrontend:
    global _active, _collector
    _active = SLOFrontend(Path(ledger_path), defaults, admission)
    # The engine core may be killed before its scheduler can remove the file.
    atexit.register(_active.ledger_path.unlink, missing_ok=True)
    if _collector is None:
        _collector = _Collector()
        REGISTRY.register(_collector)
    return _active


def active() -> SLOFrontend | None:
    return _active


def check_admission(extra_args: Mapping[str, Any] | None) -> None:
    if _active is not None:
        _active.admit(extra_args)
