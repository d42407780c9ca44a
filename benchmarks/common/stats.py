# SPDX-License-Identifier: Apache-2.0
"""Statistics of noisy timings: paired A/B runs, their ratios and percentiles.

These machines are noisy and slow down over a run, so an A/B comparison alternates which arm
goes first and reports medians and geometric means of per-pair ratios."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 <= q <= 100) of `values`."""
    if not values:
        raise ValueError("values: empty")
    if not 0 <= q <= 100:
        raise ValueError(f"q: {q} is not in [0, 100]")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def geomean(values: Sequence[float]) -> float:
    """Geometric mean; the mean of ratios that treats 2x and 0.5x as opposites."""
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"values: the geometric mean needs positive numbers, got {values!r}")
    return math.exp(statistics.fmean(math.log(v) for v in values))


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> dict[str, float]:
    """Ratios of pair i (numerators[i] / denominators[i]): their median and geometric mean."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError("numerators, denominators: need the same, non-zero, number of runs")
    ratios = [n / d for n, d in zip(numerators, denominators)]
    return {"median": statistics.median(ratios), "geomean": geomean(ratios), "pairs": len(ratios)}


def alternate(arms: Mapping[str, Callable[[], T]], pairs: int) -> dict[str, list[T]]:
    """Runs every arm `pairs` times, in the given order on even rounds and reversed on odd
    ones, so that neither arm always runs first (warm caches, a machine slowing down)."""
    if pairs < 1:
        raise ValueError(f"pairs: {pairs} is not >= 1")
    names = list(arms)
    results: dict[str, list[T]] = {name: [] for name in names}
    for round_ in range(pairs):
        for name in names if round_ % 2 == 0 else reversed(names):
            results[name].append(arms[name]())
    return results
