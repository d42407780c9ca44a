# SPDX-License-Identifier: Apache-2.0
"""BusyTracker: when a stage had work, for utilization timelines and metrics."""

from __future__ import annotations

import time
from collections import deque

MAX_INTERVALS = 10_000  # bounded: a long-running server keeps only recent history


class BusyTracker:
    """Records [start, end) intervals on the monotonic clock (shared by all processes of the
    machine, so intervals from a stage process line up with the orchestrator's)."""

    def __init__(self) -> None:
        self.intervals: deque[tuple[float, float]] = deque(maxlen=MAX_INTERVALS)
        self._active = 0
        self._since = 0.0

    def enter(self) -> None:
        if self._active == 0:
            self._since = time.monotonic()
        self._active += 1

    def exit(self) -> None:
        self._active -= 1
        if self._active == 0:
            self.intervals.append((self._since, time.monotonic()))

    def add(self, start: float, end: float) -> None:
        self.intervals.append((start, end))

    def busy_seconds(self, since: float = 0.0) -> float:
        return sum(
            max(0.0, end - max(start, since)) for start, end in self.intervals if end > since
        )
