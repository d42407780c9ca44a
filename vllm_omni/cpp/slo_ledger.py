# SPDX-License-Identifier: Apache-2.0
"""SLOLedger: which requests met their TTFT / TPOT SLOs, kept by the CPP scheduler.

Only the engine core knows a request's SLO, its arrival and when each of its tokens came out,
but vLLM's stat loggers live in the API server and never see a request's SLO. So the scheduler
keeps this ledger and publishes a small JSON snapshot of it (counters, slack histograms and the
prefill work queued with its deadlines) to a file named in its config; the API server reads the
snapshot for /metrics and for admission control (vllm_omni.cpp.slo_frontend). Snapshots are
written atomically (rename), every `PUBLISH_INTERVAL_S` and whenever a request joins or leaves
the prefill backlog.

Times are measured in the engine core: TTFT from the request's arrival (stamped by the API
server) to the scheduler receiving its first token; TPOT per decode step, from one token of a
request to its next.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.cpp.cost_model import write_json_atomic
from vllm_omni.cpp.slo import SLOTargets

SLACK_BUCKETS_S = (-5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Histogram bounds of slack = SLO - measured, in seconds (< 0: missed)."""

PUBLISH_INTERVAL_S = 0.1


@dataclass
class SlackHistogram:
    """Met/missed counts and a histogram of slack for one kind of SLO (TTFT or TPOT)."""

    met: int = 0
    missed: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * (len(SLACK_BUCKETS_S) + 1))

    def observe(self, target_s: float, measured_s: float) -> None:
        slack = target_s - measured_s
        if slack >= 0:
            self.met += 1
        else:
            self.missed += 1
        self.counts[bisect.bisect_left(SLACK_BUCKETS_S, slack)] += 1  # bucket: slack <= bound

    def to_dict(self) -> dict[str, Any]:
        return {"met": self.met, "missed": self.missed, "counts": self.counts}


@dataclass
class _Tracked:
    arrival: float
    targets: SLOTargets
    last_token: float | None = None


class SLOLedger:
    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path else None
        self.ttft = SlackHistogram()
        self.tpot = SlackHistogram()
        self._tracked: dict[str, _Tracked] = {}
        self._backlog: dict[str, tuple[float | None, float]] = {}
        self._published_at = 0.0
        self._published_backlog: set[str] | None = None

    def track(self, request_id: str, arrival: float, targets: SLOTargets) -> None:
        if targets.ttft_s is not None or targets.tpot_s is not None:
            self._tracked.setdefault(request_id, _Tracked(arrival, targets))

    def on_tokens(self, request_id: str, num_tokens: int, now: float | None = None) -> None:
        """`num_tokens` new tokens of the request reached the scheduler (wall clock `now`)."""
        tracked = self._tracked.get(request_id)
        if tracked is None or num_tokens <= 0:
            return
        now = time.time() if now is None else now
        if tracked.last_token is None:
            if tracked.targets.ttft_s is not None:
                self.ttft.observe(tracked.targets.ttft_s, now - tracked.arrival)
        elif tracked.targets.tpot_s is not None:
            per_token = (now - tracked.last_token) / num_tokens
            for _ in range(num_tokens):
                self.tpot.observe(tracked.targets.tpot_s, per_token)
        tracked.last_token = now

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in list(request_ids):
            self._tracked.pop(request_id, None)
            self._backlog.pop(request_id, None)

    def drop_from_backlog(self, request_ids: Iterable[str]) -> None:
        """Their prefill is done (or they left); their TPOT is still tracked."""
        for request_id in list(request_ids):
            self._backlog.pop(request_id, None)

    def keep_only(self, live: Iterable[str]) -> None:
        """Drop what is not live any more (aborted requests never report a finish)."""
        live = set(live)
        self.forget([rid for rid in self._tracked if rid not in live])
        self.forget([rid for rid in self._backlog if rid not in live])

    def set_backlog(self, entries: Iterable[tuple[str, float | None, float]]) -> None:
        """Prefill work still queued: (request id, TTFT deadline or None, remaining cost in s)."""
        self._backlog = {rid: (deadline, cost) for rid, deadline, cost in entries}

    @property
    def backlog_ids(self) -> set[str]:
        return set(self._backlog)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        return {
            "time": time.time() if now is None else now,
            "ttft": self.ttft.to_dict(),
            "tpot": self.tpot.to_dict(),
            "backlog": sorted(self._backlog.values(), key=lambda e: (e[0] is None, e[0] or 0)),
        }

    def publish(self, force: bool = False) -> bool:
        """Write the snapshot when a request joined or left the backlog (admission control reads
        it) or the last one is `PUBLISH_INTERVAL_S` old; True when written."""
        if self.path is None:
            return False
        now = time.monotonic()
        changed = self._backlog.keys() != self._published_backlog
        if not (force or changed) and now - self._published_at < PUBLISH_INTERVAL_S:
            return False
        write_json_atomic(self.path, self.snapshot())
        self._published_at = now
        self._published_backlog = set(self._backlog)
        return True

    def remove_file(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def read_snapshot(path: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
