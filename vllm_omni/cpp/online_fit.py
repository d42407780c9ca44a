# SPDX-License-Identifier: Apache-2.0
"""OnlineCostModel: the CPP scheduler fits its cost model to the steps it runs.

The worker of the last pipeline rank reports each forward pass's busy seconds with the chunks it
ran (`vllm_omni.cpp.worker`); the scheduler hands them to `observe` (bookkeeping only) and asks
for a refit now and then, which runs on a background thread (`OnlineCalibration`) so no step
waits for it. A fit starts from what the engine knew at start-up:

- a model in seconds (a cached calibration, an earlier online fit, a `--cpp-cost-model` file) is
  a prior: rows of its predictions at `PRIOR_GRID` join the measured steps, as many as the steps
  it was fitted from (capped), so a new engine's first, noisy steps barely move a fit of hundreds
  of steps, and the steps of a long run outweigh it;
- the analytic FLOP model has no scale in seconds and is no prior. While the engine plans with
  it, the scheduler alternates long and short chunks (`EXPLORE_DITHER`): chunks of equal FLOPs
  would put every step on one curve of (size, context), along which the cost model's terms
  cannot be told apart.

Outliers (the first steps after start-up, a step stretched by a GC pause or a noisy neighbour)
are left out: the first `SKIP_FIRST_STEPS` steps, and steps more than `OUTLIER_RATIO` off a fit.
A fit is adopted when it has `MIN_FIT_STEPS` prefill steps and a relative RMS error within
`MAX_ADOPT_RMSE`; the scheduler then persists it to the calibration cache, so the next engine for
the same model, pipeline size, dtype and device starts from it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_omni.cpp.cost_model import CostModel, StepSample, write_json_atomic
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

SKIP_FIRST_STEPS = 4
"""Steps ignored after start-up (lazy initialisation, first-touch page faults)."""
PREFILL_WINDOW = 512
DECODE_WINDOW = 128
"""Most recent steps kept: prefill steps (any chunk > 1 token) and decode-only steps apart, so a
long stretch of decodes does not push out what the prefill terms are fitted from."""
MIN_FIT_STEPS = 12
"""Prefill steps needed before a fit is adopted."""
REFIT_EVERY = 8
"""New steps between refits."""
MAX_ADOPT_RMSE = 0.25
"""A fit with a larger relative RMS error is not adopted (the model's form does not fit)."""
OUTLIER_RATIO = 1.5
"""A step measured more than this factor off a fit's prediction is dropped as an outlier."""
PRIOR_GRID = tuple((x, ctx) for x in (64, 256, 1024, 4096) for ctx in (0, 4096, 16384, 32768))
"""Shapes at which a prior in seconds is sampled."""
PRIOR_DEFAULT_STEPS = 64
"""Weight, in steps, of a prior that does not say how many steps it came from (a calibration)."""
PRIOR_MAX_STEPS = 256
"""Most weight a prior gets: half the prefill window, so the measured steps can outweigh it."""
EXPLORE_DITHER = 0.3
"""While exploring, step budgets alternate between (1 + d) and (1 - d) times the plan's: about
d * (p - 1) / (m + p - 1) more TTFT for the prefills planned that way (~1.7% at m=16, p=2)."""
SAVE_INTERVAL_S = 30.0


@dataclass(frozen=True)
class FitStatus:
    """Which model the scheduler plans with, and how well it fits the recent steps."""

    source: str
    """"online" (fitted here), "cached" (calibration cache), "file" (--cpp-cost-model) or
    "analytic" (FLOPs)."""
    model: CostModel
    rel_rmse: float | None = None
    """Relative RMS error of the model on the steps it was fitted to (None: not fitted here)."""
    num_steps: int = 0
    """Steps the fit used (outliers excluded)."""
    outliers: int = 0
    """Steps of the window this fit left out as outliers."""
    fitted_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "model": self.model.to_dict(),
            "rel_rmse": self.rel_rmse,
            "num_steps": self.num_steps,
            "outliers": self.outliers,
            "fitted_at": self.fitted_at,
        }


class OnlineCostModel:
    """Recent step timings and the fit of the cost model to them (not thread-safe: the scheduler
    calls `observe`; `fit` works on a snapshot and may run on another thread)."""

    def __init__(self, prior: CostModel, source: str, prior_steps: int | None = None) -> None:
        """`prior_steps`: how many steps the prior was fitted from (None: not known)."""
        self.status = FitStatus(source, prior)
        self.prior = prior
        weight = min(prior_steps or PRIOR_DEFAULT_STEPS, PRIOR_MAX_STEPS)
        self._prior_repeats = max(1, round(weight / len(PRIOR_GRID)))
        self._prefills: deque[StepSample] = deque(maxlen=PREFILL_WINDOW)
        self._decodes: deque[StepSample] = deque(maxlen=DECODE_WINDOW)
        self._skipped = 0
        self.new_steps = 0

    @property
    def model(self) -> CostModel:
        return self.status.model

    @property
    def exploring(self) -> bool:
        """True while the model has no scale in seconds (the analytic one): see EXPLORE_DITHER."""
        return self.model.unit != "s"

    def observe(self, chunks: Iterable[tuple[int, int]], seconds: float) -> None:
        """One forward pass: its (new tokens, cached tokens) per request and busy seconds."""
        if self._skipped < SKIP_FIRST_STEPS:
            self._skipped += 1
            return
        chunks = tuple((int(x), int(c)) for x, c in chunks if x > 0)
        if not chunks or not seconds > 0 or not math.isfinite(seconds):
            return
        sample = StepSample(chunks, float(seconds))
        (self._prefills if any(x > 1 for x, _ in chunks) else self._decodes).append(sample)
        self.new_steps += 1

    def snapshot(self) -> tuple[list[StepSample], list[StepSample]]:
        self.new_steps = 0
        return list(self._prefills), list(self._decodes)

    def fit(self, prefills: list[StepSample], decodes: list[StepSample]) -> FitStatus | None:
        """Fit to a snapshot; the fit's status, or None when there is too little data or the
        fit is too poor to plan with. Pure: the caller adopts the result (`adopt`)."""
        if len(prefills) < MIN_FIT_STEPS:
            return None
        measured = prefills + decodes
        prior = (
            [StepSample(((x, ctx),), self.prior.step_cost([(x, ctx)])) for x, ctx in PRIOR_GRID]
            * self._prior_repeats
            if self.prior.unit == "s"
            else []
        )
        try:
            model = CostModel.fit(measured + prior).model
            kept = [s for s in measured if _within(model, s)]
            if len(kept) < len(measured):
                model = CostModel.fit(kept + prior).model
        except ValueError:
            return None
        outliers = len(measured) - len(kept)
        rel_rmse = _rel_rmse(model, kept)
        kept_prefills = sum(1 for s in kept if any(x > 1 for x, _ in s.chunks))
        if rel_rmse > MAX_ADOPT_RMSE or kept_prefills < MIN_FIT_STEPS:
            return None
        return FitStatus("online", model, rel_rmse, len(kept), outliers, time.time())

    def adopt(self, status: FitStatus) -> None:
        self.status = status


def _within(model: CostModel, sample: StepSample) -> bool:
    predicted = model.step_cost(sample.chunks)
    return predicted > 0 and 1 / OUTLIER_RATIO <= sample.seconds / predicted <= OUTLIER_RATIO


def _rel_rmse(model: CostModel, samples: list[StepSample]) -> float:
    errors = [(model.step_cost(s.chunks) - s.seconds) / s.seconds for s in samples]
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else math.inf


class OnlineCalibration:
    """Runs `OnlineCostModel.fit` on one background thread and saves adopted fits.

    The scheduler calls `poll()` once per step: it adopts a finished fit (returning its status,
    so the scheduler can re-plan) and starts the next one when enough new steps came in.
    """

    def __init__(
        self, online: OnlineCostModel, cache_path: Path | None, status_path: Path | None
    ) -> None:
        self.online = online
        self.cache_path = cache_path
        self.status_path = status_path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpp-online-fit")
        self._pending: Future | None = None
        self._saved_at = -math.inf
        self._unsaved = False
        self.publish()

    def poll(self) -> FitStatus | None:
        adopted = None
        if self._pending is not None and self._pending.done():
            try:
                status = self._pending.result()
            except Exception:  # a fit must never take the engine down
                logger.exception("CPP: online cost-model fit failed")
                status = None
            self._pending = None
            if status is not None:
                was = self.online.status.source
                self.online.adopt(status)
                self._unsaved = True
                adopted = status
                if was != "online":
                    logger.info(
                        "CPP: planning with the online fit (was: %s) from %d steps, relative RMS "
                        "error %.1f%%: %s",
                        was,
                        status.num_steps,
                        100 * status.rel_rmse,
                        status.model,
                    )
        if self._pending is None and self.online.new_steps >= REFIT_EVERY:
            self._pending = self._pool.submit(self._fit_and_save, *self.online.snapshot())
        return adopted

    def _fit_and_save(self, prefills, decodes) -> FitStatus | None:
        status = self.online.fit(prefills, decodes)
        if status is not None:
            # The file lags the adopted model by at most one refit: fine for the next start-up.
            self._save(status, force=False)
        return status

    def _save(self, status: FitStatus, force: bool) -> None:
        now = time.monotonic()
        try:
            if self.cache_path is not None and (force or now - self._saved_at >= SAVE_INTERVAL_S):
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                status.model.save(self.cache_path, fit=_fit_info(status))
                self._saved_at = now
                self._unsaved = False
            self.publish(status)
        except OSError as e:  # a read-only cache costs the next start-up its head start only
            logger.warning("CPP: could not save the online cost-model fit: %s", e)

    def publish(self, status: FitStatus | None = None) -> None:
        if self.status_path is not None:
            status = status or self.online.status
            write_json_atomic(self.status_path, {**status.to_dict(), "time": time.time()})

    def close(self) -> None:
        """Wait for a running fit and save the adopted one if newer than the file."""
        if self._pending is not None:
            self._pending.result()
            self.poll()
        self._pool.shutdown(wait=True)
        if self._unsaved and self.online.status.source == "online":
            self._save(self.online.status, force=True)
        if self.status_path is not None:
            self.status_path.unlink(missing_ok=True)


def _fit_info(status: FitStatus) -> dict[str, Any]:
    return {
        "source": "online",
        "rel_rmse": status.rel_rmse,
        "num_steps": status.num_steps,
        "fitted_at": status.fitted_at,
    }
