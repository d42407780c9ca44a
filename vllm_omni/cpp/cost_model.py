# SPDX-License-Identifier: Apache-2.0
"""Per-step compute cost of prefill chunks, and a planner that sizes chunks to equal cost.

A chunk of x new tokens after L cached tokens costs, per pipeline stage, chunk_cost(x, L) =
linear * x + attention * x * (L + x / 2); every step also pays `step_overhead`. Pure Python +
numpy (no torch, no vLLM): cheap enough per request per step, and testable in microseconds.

Causal convention (exact, not an approximation): token i (0-based within the chunk) attends
to L + i + 1 keys, so a chunk has sum_i (L + i + 1) = x * (L + (x + 1) / 2)
= x * (L + x / 2) + x / 2 query-key pairs. `CostModel.analytic` folds the trailing x / 2 into
`linear` (linear = 2 * params + attention / 2), so `chunk_cost` equals the brute-force sum.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

UNITS = ("flop", "s")
FIT_KEY = "fit"
"""Optional key of a saved model: how it was obtained (online fit: its error and step count)."""


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to a temporary sibling and rename it: readers (the next engine, the API
    server's /metrics) never see a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _check_int(name: str, value: Any, minimum: int) -> None:
    # bool is an int subclass; a True layer count is always a bug.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_real(name: str, value: Any, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")


def _nnls(design: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, float]:
    """argmin |design @ coef - target|^2 over coef >= 0, and the minimum. Exact for few columns:
    the optimum is the plain least squares on its support, so trying every subset finds it."""
    cols = design.shape[1]
    best, best_sq = np.zeros(cols), float(target @ target)
    subsets = (s for k in range(1, cols + 1) for s in itertools.combinations(range(cols), k))
    for active in subsets:
        sol = np.linalg.lstsq(design[:, active], target, rcond=None)[0]
        if np.all(sol >= 0):
            coef = np.zeros(cols)
            coef[list(active)] = sol
            sq = float(np.sum((design @ coef - target) ** 2))
            if sq < best_sq:
                best, best_sq = coef, sq
    return best, best_sq


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer with GQA attention and a SwiGLU MLP."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_int(f.name, getattr(self, f.name), 1)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )

    @classmethod
    def from_hf_config(cls, cfg: Any) -> ModelShape:
        """Read a transformers-style config object or dict (multimodal configs: its text_config)."""
        get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
        if get("num_hidden_layers") is None and get("text_config") is not None:
            return cls.from_hf_config(get("text_config"))
        for key in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        ):
            if get(key) is None:
                raise ValueError(f"config lacks {key}")
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        # Some configs carry these keys explicitly set to None; treat that as absent.
        kv_heads = get("num_key_value_heads") or heads
        head_dim = get("head_dim") or hidden // heads
        return cls(
            get("num_hidden_layers"),
            hidden,
            heads,
            kv_heads,
            head_dim,
            get("intermediate_size"),
            get("vocab_size"),
        )

    @classmethod
    def llama3_8b(cls) -> ModelShape:
        return cls(32, 4096, 32, 8, 128, 14336, 128256)

    @classmethod
    def llama3_70b(cls) -> ModelShape:
        return cls(80, 8192, 64, 8, 128, 28672, 128256)

    def params_per_layer(self) -> int:
        """Weights multiplied per token in one layer: q, k, v, o projections and the SwiGLU MLP."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.hidden_size * (2 * q + 2 * kv + 3 * self.intermediate_size)


@dataclass(frozen=True)
class CostModel:
    """cost(x, L) = linear * x + attention * x * (L + x / 2) + context * L for x > 0, plus
    step_overhead per step.

    Coefficients are in `unit` ("flop": analytic, "s": fitted wall time) per token, per
    token-key pair, per cached token and per step. `context` is a chunk's pass over the cached
    keys and values, paid once per chunk whatever its size: FLOPs do not see it (0 in the analytic
    model), but on a CPU it makes small chunks after a long context slow (measured: tens of ms per
    chunk at 32K tokens of context for the tiny 8-layer model), so calibration fits it.
    linear or attention must be > 0, else no budget bounds a chunk.
    """

    linear: float
    attention: float
    step_overhead: float = 0.0
    unit: str = "flop"
    context: float = 0.0

    def __post_init__(self) -> None:
        for name in ("linear", "attention", "step_overhead", "context"):
            _check_real(name, getattr(self, name))
        if self.linear == 0 and self.attention == 0:
            raise ValueError("linear and attention are both 0: chunks would cost nothing")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")

    def chunk_cost(self, num_new_tokens: int, num_cached_tokens: int) -> float:
        """Cost of prefilling `num_new_tokens` after `num_cached_tokens`, without step_overhead."""
        x, cached = num_new_tokens, num_cached_tokens
        if x < 0 or cached < 0:
            raise ValueError(f"num_new_tokens ({x}) and num_cached_tokens ({cached}) must be >= 0")
        if x == 0:
            return 0.0
        return self._work(x, cached)

    def chunk_costs(self, num_new_tokens: np.ndarray, num_cached_tokens: np.ndarray) -> np.ndarray:
        """`chunk_cost` elementwise over arrays, unchecked: a planner's table of many chunks."""
        return np.where(num_new_tokens > 0, self._work(num_new_tokens, num_cached_tokens), 0.0)

    def _work(self, x, cached):
        return self.linear * x + self.attention * x * (cached + x / 2) + self.context * cached

    def step_cost(self, chunks: Iterable[tuple[int, int]]) -> float:
        """step_overhead + the cost of each (num_new_tokens, num_cached_tokens); a decode is x=1."""
        return self.step_overhead + sum(self.chunk_cost(x, cached) for x, cached in chunks)

    def max_chunk(self, num_cached_tokens: int, budget: float) -> int:
        """Largest int x >= 0 with chunk_cost(x, num_cached_tokens) <= budget (exact).

        Solves (attention / 2) x^2 + (linear + attention * L) x = budget - context * L in closed
        form, then steps by +-1 so the inequality holds exactly as `chunk_cost` evaluates it.
        """
        _check_real("budget", budget)
        budget_left = budget - self.context * num_cached_tokens
        if budget_left <= 0:
            return 0
        slope = self.linear + self.attention * num_cached_tokens
        # 2c / (b + sqrt(b^2 + 4ac)) is the positive root without cancellation (also for a = 0).
        denom = slope + math.sqrt(slope * slope + 2 * self.attention * budget_left)
        x = int(2 * budget_left / denom) if denom > 0 else 0
        while self.chunk_cost(x + 1, num_cached_tokens) <= budget:
            x += 1
        while x > 0 and self.chunk_cost(x, num_cached_tokens) > budget:
            x -= 1
        return x

    @classmethod
    def analytic(
        cls, shape: ModelShape, pp_size: int = 1, include_lm_head: bool = False
    ) -> CostModel:
        """FLOPs of the heaviest pipeline stage (ceil(num_layers / pp_size) layers).

        A multiply-add is 2 FLOPs; per layer, head and query-key pair, QK^T and AV cost
        2 * head_dim each. Norms, RoPE, softmax and activations (O(h) per token) are ignored.
        `include_lm_head` adds 2 * vocab * hidden as step_overhead: one sampled position per
        step, charged as if on the heaviest stage (an upper bound; negligible either way).
        """
        _check_int("pp_size", pp_size, 1)
        if pp_size > shape.num_layers:
            raise ValueError(f"pp_size ({pp_size}) exceeds num_layers ({shape.num_layers})")
        layers = -(-shape.num_layers // pp_size)
        attention = 4.0 * layers * shape.num_heads * shape.head_dim
        # + attention / 2: the x / 2 term of the exact causal pair count (module docstring).
        linear = 2.0 * layers * shape.params_per_layer() + attention / 2
        overhead = 2.0 * shape.vocab_size * shape.hidden_size if include_lm_head else 0.0
        return cls(linear, attention, overhead, "flop")

    @classmethod
    def fit(
        cls, samples: Iterable[StepSample], step_overhead: bool = True, context: bool = True
    ) -> FitResult:
        """Fit seconds ~ c + a * sum(x) + b * sum(x * (L + x / 2)) + d * sum(L), coefficients >= 0.

        `context=False` leaves d out (0); it needs chunks of different sizes at similar contexts.

        Residuals are relative (each row weighted by 1 / seconds): step times span decodes of
        milliseconds to prefills of seconds, and the planner needs relative accuracy at both
        ends. `rel_rmse` is the root-mean-square of (predicted - measured) / measured.
        """
        samples = list(samples)
        all_names = ("step_overhead", "linear", "attention", "context")
        names = tuple(
            n
            for n in all_names
            if (n != "step_overhead" or step_overhead) and (n != "context" or context)
        )
        if len(samples) < len(names):
            raise ValueError(f"samples: need at least {len(names)}, got {len(samples)}")
        y = np.array([s.seconds for s in samples])
        feats = np.array(
            [
                [
                    1.0,
                    sum(x for x, _ in s.chunks),
                    sum(x * (cached + x / 2) for x, cached in s.chunks),
                    sum(cached for x, cached in s.chunks if x > 0),
                ]
                for s in samples
            ]
        )
        columns = [all_names.index(n) for n in names]
        weighted = feats[:, columns] / y[:, None]
        # Column scaling: sum(x * L) is ~1e6 times sum(x); unscaled lstsq would lose digits.
        scale = np.linalg.norm(weighted, axis=0)
        scale[scale == 0] = 1.0
        design, target = weighted / scale, np.ones(len(samples))
        best, best_sq = _nnls(design, target)
        values = dict(zip(names, (best / scale).tolist()))
        if values["linear"] == 0 and values["attention"] == 0:
            raise ValueError("samples: step time does not grow with tokens; cannot fit a cost")
        model = cls(
            values["linear"],
            values["attention"],
            values.get("step_overhead", 0.0),
            "s",
            values.get("context", 0.0),
        )
        return FitResult(model, math.sqrt(best_sq / len(samples)), len(samples))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        """Inverse of to_dict; an unknown or missing key raises ValueError naming it ("context"
        may be missing: files written before it existed)."""
        known = [f.name for f in fields(cls)]
        for key in data:
            if key not in known:
                raise ValueError(f"unknown cost model key {key!r} (known: {known})")
        for key in known:
            if key not in data and key != "context":
                raise ValueError(f"cost model lacks key {key!r}")
        return cls(**data)

    def save(self, path: str | Path, fit: Mapping[str, Any] | None = None) -> None:
        """Write the coefficients as JSON, with `fit` (how they were obtained) if given; written
        to a temporary file and renamed, so a reader never sees half a file."""
        write_json_atomic(Path(path), self.to_dict() | ({FIT_KEY: dict(fit)} if fit else {}))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls.load_with_fit(path)[0]

    @classmethod
    def load_with_fit(cls, path: str | Path) -> tuple[CostModel, dict[str, Any] | None]:
        """The model in a file written by `save`, and its `fit` record (None if it has none)."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
        fit = data.pop(FIT_KEY, None)
        return cls.from_dict(data), fit


@dataclass(frozen=True)
class StepSample:
    """One measured step: its chunks as (num_new_tokens, num_cached_tokens), and wall seconds."""

    chunks: tuple[tuple[int, int], ...]
    seconds: float

    def __post_init__(self) -> None:
        chunks = tuple(tuple(c) for c in self.chunks)
        if not chunks:
            raise ValueError("chunks must not be empty")
        for x, cached in chunks:
            _check_int("chunks[].num_new_tokens", x, 1)
            _check_int("chunks[].num_cached_tokens", cached, 0)
        _check_real("seconds", self.seconds, positive=True)
        object.__setattr__(self, "chunks", chunks)


@dataclass(frozen=True)
class FitResult:
    """A fitted model and its root-mean-square relative error on the samples it was fit to."""

    model: CostModel
    rel_rmse: float
    num_samples: int
