# SPDX-License-Identifier: Apache-2.0
"""Per-request first-block residual caching (FBCache) inside step-level batches.

A DiT's later blocks change little between neighbouring denoising steps once the image has
taken shape. First-block caching runs the first block every step and compares its residual
(output minus input) with the one of the request's last fully computed step: when the relative
L1 distance is below a threshold, the request skips the remaining blocks and adds the residual
they produced last time.

Published implementations (cache-dit, ParaAttention, TeaCache) decide once per *batch*, which
breaks step-level continuous batching where one transformer call mixes requests at different
steps. Here every request decides for itself: block 0 runs on all rows, one host sync reads
every request's distance, the remaining blocks run on the rows that need them only (gathered
and scattered back), and cached rows reuse their own residual. A request's classifier-free-
guidance rows decide together (the larger distance of the two), so the guided difference is
never taken between a fresh and a stale prediction.

The state (last first-block residual, last tail residual, counters) lives in the request's
DiTCacheManager entry: finishing or aborting the request frees it with everything else. This
module holds the policy, the per-request state and the decision (`FirstBlockCache`); a family's
cached forward (its transformer's own blocks: vllm_omni.models.qwen_image.cached_forward,
vllm_omni.models.wan.cached_forward) runs around them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from vllm_omni.diffusion.cache_manager import DiTCacheEntry

FIRST_RESIDUAL = "fbcache_first_residual"
TAIL_RESIDUAL = "fbcache_tail_residual"
CONSECUTIVE = "fbcache_consecutive"
CACHED_STEPS = "fbcache_cached_steps"
POLICY = "fbcache_policy"


@dataclass(frozen=True)
class ResidualCacheConfig:
    """`threshold`: a request skips the remaining blocks while the relative L1 distance of its
    first-block residual to the last computed step's stays below it (0 turns caching off).
    `warmup_steps` first and `final_steps` last steps are always computed, and at most
    `max_consecutive` steps in a row are served from the cache."""

    threshold: float = 0.24
    """Relative L1 distance of the first block's residual below which a step is served from
    the cache (0: off)."""
    warmup_steps: int = 4
    """First steps always computed."""
    final_steps: int = 1
    """Last steps always computed."""
    max_consecutive: int = 3
    """Most steps in a row served from the cache."""

    def __post_init__(self) -> None:
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 1:
            raise ValueError(f"threshold: must be a number in [0, 1], got {t!r}")
        for name in ("warmup_steps", "final_steps", "max_consecutive"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.threshold > 0 and self.max_consecutive > 0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ResidualCacheConfig:
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ValueError(f"{key}: unknown residual-cache setting; known: {sorted(known)}")
        return cls(**values)

    @classmethod
    def parse(cls, text: str) -> ResidualCacheConfig:
        """The CLI's `--dit-cache` value: a threshold (`0.12`) or a JSON object of fields."""
        try:
            threshold = float(text)
        except ValueError:
            threshold = None
        if threshold is not None:
            return cls(threshold=threshold)
        if not text.lstrip().startswith("{"):
            raise ValueError(f"expected a threshold or a JSON object, got {text!r}")
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON ({e})") from None
        if not isinstance(values, dict):
            raise ValueError(f"expected a JSON object, got {text!r}")
        return cls.from_dict(values)

    def with_threshold(self, threshold: float | None) -> ResidualCacheConfig:
        """This policy with a request's own threshold (None keeps the stage's)."""
        return self if threshold is None else replace(self, threshold=threshold)


@dataclass
class RowGroup:
    """One request's rows in the batch: the conditional row, and the unconditional one under
    guidance. `policy` None: computed every step, no state kept."""

    start: int
    stop: int
    entry: DiTCacheEntry
    step: int
    num_steps: int

    @property
    def policy(self) -> ResidualCacheConfig | None:
        policy = self.entry.state.get(POLICY)
        return policy if policy is not None and policy.enabled else None

    def must_compute(self) -> bool:
        p = self.policy
        return (
            p is None
            or FIRST_RESIDUAL not in self.entry.tensors
            or self._forced(self.step)
            or self.entry.state.get(CONSECUTIVE, 0) >= p.max_consecutive
        )

    def keeps_state(self) -> bool:
        """Whether this step's residuals are needed: the next step may be served from them."""
        return self.policy is not None and not self._forced(self.step + 1)

    def _forced(self, step: int) -> bool:
        p = self.policy
        return step < p.warmup_steps or step >= self.num_steps - p.final_steps


class FirstBlockCache:
    """The per-request decision around a family's blocks, and its counters.

    A family's cached forward runs its first block on every row and hands the rest of its
    blocks to `run` as `tail(index)`: the remaining blocks on the rows `index` of the first
    block's output (None: every row). Rows whose request is served from the cache take the
    first block's output plus the tail residual of that request's last computed step."""

    def __init__(self) -> None:
        self.num_computed_rows = 0  # row-steps through every block
        self.num_cached_rows = 0  # row-steps served from the cache

    def run(
        self,
        hidden: torch.Tensor,
        first_out: torch.Tensor,
        groups: list[RowGroup],
        tail: Callable[[torch.Tensor | None], torch.Tensor],
    ) -> torch.Tensor:
        """The last block's output for every row (`hidden`: the first block's input)."""
        first = first_out - hidden
        compute = self._decide(first, groups)
        rows = [r for g, c in zip(groups, compute) if c for r in range(g.start, g.stop)]
        if len(rows) == first_out.shape[0]:  # nothing cached: the plain forward
            out = tail(None)
        else:
            out = first_out.clone()
            if rows:
                index = torch.tensor(rows, device=first_out.device)
                out.index_copy_(0, index, tail(index))
        for group, computes in zip(groups, compute):
            rows_of = slice(group.start, group.stop)
            state = group.entry.state
            if computes:
                self.num_computed_rows += group.stop - group.start
                state[CONSECUTIVE] = 0
                if group.keeps_state():
                    group.entry.tensors[FIRST_RESIDUAL] = first[rows_of].clone()
                    group.entry.tensors[TAIL_RESIDUAL] = out[rows_of] - first_out[rows_of]
            else:
                self.num_cached_rows += group.stop - group.start
                out[rows_of] = first_out[rows_of] + group.entry.tensors[TAIL_RESIDUAL]
                state[CONSECUTIVE] = state.get(CONSECUTIVE, 0) + 1
                state[CACHED_STEPS] = state.get(CACHED_STEPS, 0) + 1
        return out

    def _decide(self, first: torch.Tensor, groups: list[RowGroup]) -> list[bool]:
        """Per group: whether it runs the remaining blocks. One host sync for all distances."""
        compute = [g.must_compute() for g in groups]
        candidates = [i for i, c in enumerate(compute) if not c]
        if not candidates:
            return compute
        distances = []
        for i in candidates:
            g = groups[i]
            previous = g.entry.tensors[FIRST_RESIDUAL]
            current = first[g.start : g.stop]
            # per row, then the larger of a request's rows (guidance rows decide together)
            change = (current - previous).abs().flatten(1).mean(1)
            scale = previous.abs().flatten(1).mean(1).clamp_min(1e-12)
            distances.append((change / scale).max())
        for i, distance in zip(candidates, torch.stack(distances).tolist()):
            compute[i] = distance >= groups[i].policy.threshold
        return compute


def forget(entry: DiTCacheEntry) -> None:
    """Drop a request's cached residuals: its next step is computed (e.g. another expert's)."""
    entry.tensors.pop(FIRST_RESIDUAL, None)
    entry.tensors.pop(TAIL_RESIDUAL, None)
