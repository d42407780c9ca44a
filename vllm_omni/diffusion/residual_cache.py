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
DiTCacheManager entry: finishing or aborting the request frees it with everything else.
"""

from __future__ import annotations

import json
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
    warmup_steps: int = 4
    final_steps: int = 1
    max_consecutive: int = 3

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


def supports(transformer) -> bool:
    """Whether `FirstBlockCachedForward` knows this transformer's forward: Qwen-Image's
    dual-stream blocks, without the edit-model extras."""
    needed = ("img_in", "txt_norm", "txt_in", "time_text_embed", "pos_embed", "norm_out")
    config = getattr(transformer, "config", None)
    return (
        config is not None
        and all(hasattr(transformer, name) for name in (*needed, "proj_out", "transformer_blocks"))
        and len(transformer.transformer_blocks) >= 2
        and not config.get("zero_cond_t", False)
        and not config.get("use_additional_t_cond", False)
        and not config.get("guidance_embeds", False)
    )


class FirstBlockCachedForward:
    """The transformer's forward, block by block, with per-request first-block caching.

    With every request computing, it performs exactly the operations of the transformer's own
    forward (tests/diffusion/test_residual_cache.py checks the outputs are equal)."""

    def __init__(self, transformer) -> None:
        if not supports(transformer):
            raise ValueError(
                f"dit.residual_cache: {type(transformer).__name__} is not supported (Qwen-Image "
                "transformers without zero_cond_t / additional_t_cond / guidance embeddings are)"
            )
        self.transformer = transformer
        self.num_computed_rows = 0  # row-steps through every block
        self.num_cached_rows = 0  # row-steps served from the cache

    def __call__(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None,
        img_shapes: list,
        groups: list[RowGroup],
    ) -> torch.Tensor:
        from diffusers.models.transformers.transformer_qwenimage import (
            compute_text_seq_len_from_mask,
        )

        t = self.transformer
        hidden = t.img_in(latents)
        timestep = timestep.to(hidden.dtype)
        text = t.txt_in(t.txt_norm(text))
        text_len, _, text_mask = compute_text_seq_len_from_mask(text, text_mask)
        temb = t.time_text_embed(timestep, hidden, None)
        rope = t.pos_embed(img_shapes, max_txt_seq_len=text_len, device=hidden.device)
        blocks = t.transformer_blocks

        def run(block, h, txt, mask, emb):
            txt, h = block(
                hidden_states=h,
                encoder_hidden_states=txt,
                encoder_hidden_states_mask=mask,
                temb=emb,
                image_rotary_emb=rope,
                joint_attention_kwargs=None,
                modulate_index=None,
            )
            return h, txt

        first_out, text = run(blocks[0], hidden, text, text_mask, temb)
        first = first_out - hidden
        compute = self._decide(first, groups)
        rows = [r for g, c in zip(groups, compute) if c for r in range(g.start, g.stop)]
        if len(rows) == first_out.shape[0]:  # nothing cached: the plain forward
            h = first_out
            for block in blocks[1:]:
                h, text = run(block, h, text, text_mask, temb)
            out = h
        else:
            out = first_out.clone()
            if rows:
                index = torch.tensor(rows, device=hidden.device)
                sub_first = first_out.index_select(0, index)
                h, txt = sub_first, text.index_select(0, index)
                mask = None if text_mask is None else text_mask.index_select(0, index)
                emb = temb.index_select(0, index)
                for block in blocks[1:]:
                    h, txt = run(block, h, txt, mask, emb)
                out.index_copy_(0, index, h)
        for group, computes in zip(groups, compute):
            rows_of = slice(group.start, group.stop)
            if computes:
                self.num_computed_rows += group.stop - group.start
                group.entry.state[CONSECUTIVE] = 0
                if group.keeps_state():
                    tail = out[rows_of] - first_out[rows_of]
                    group.entry.tensors[FIRST_RESIDUAL] = first[rows_of].clone()
                    group.entry.tensors[TAIL_RESIDUAL] = tail
            else:
                self.num_cached_rows += group.stop - group.start
                out[rows_of] = first_out[rows_of] + group.entry.tensors[TAIL_RESIDUAL]
                group.entry.state[CONSECUTIVE] = group.entry.state.get(CONSECUTIVE, 0) + 1
                group.entry.state[CACHED_STEPS] = group.entry.state.get(CACHED_STEPS, 0) + 1
        out = t.norm_out(out, temb)
        return t.proj_out(out)

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
