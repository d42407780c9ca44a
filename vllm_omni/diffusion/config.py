# SPDX-License-Identifier: Apache-2.0
"""DiTConfig: how a diffusion stage loads and runs its pipeline."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from vllm_omni.diffusion.deadline import POLICIES
from vllm_omni.diffusion.residual_cache import ResidualCacheConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DiTConfig:
    """`model`: a diffusers pipeline folder (model_index.json). `dtype` "auto" keeps the
    weights' dtype. `device` "auto" picks CUDA when present. `num_threads`: torch intra-op
    threads of the DiT process (None: torch's default). `max_num_seqs`: requests batched
    together. `cache_max_bytes` / `cache_ttl_s`: see DiTCacheConfig. `decode`: False makes the
    stage return latents (a `vae_decoder` stage downstream turns them into images).
    `residual_cache`: first-block residual caching for every request of the stage (a
    ResidualCacheConfig or its fields as a dict; None: off, requests may still opt in).
    `scheduling_policy`: `fcfs` or `deadline` (least slack first, step scheduler only);
    `admission_control`: refuse requests whose latency SLO cannot be met (HTTP 429).
    vllm_omni.diffusion.deadline."""

    model: str
    """The stage's model folder (the stage's `model`)."""
    dtype: str = "auto"
    """`auto` (the weights' own), `float32`, `bfloat16` or `float16`."""
    device: str = "auto"
    """A torch device; `auto`: CUDA when present, else the CPU."""
    num_threads: int | None = None
    """torch intra-op threads of the stage process (None: torch's default; some executors set
    their own on a CPU)."""
    max_num_seqs: int = 8
    """Requests batched together."""
    cache_max_bytes: int | None = None
    """Bound on the per-request state the stage keeps (None: unbounded)."""
    cache_ttl_s: float = 600.0
    """Per-request state untouched this long is dropped."""
    decode: bool = True
    """False: the stage returns latents (a `vae_decoder` stage downstream makes the images)."""
    residual_cache: ResidualCacheConfig | None = None
    """First-block residual caching for every request of the stage (fields below; None: off,
    requests may still opt in with `cache_threshold`)."""
    scheduling_policy: str = "fcfs"
    """`fcfs` or `deadline` (least slack first by each request's latency SLO; `step` only)."""
    admission_control: bool = False
    """With `deadline`: refuse (HTTP 429) a request whose latency SLO cannot be met."""

    def __post_init__(self) -> None:
        if isinstance(self.residual_cache, dict):
            try:
                policy = ResidualCacheConfig.from_dict(self.residual_cache)
            except (ValueError, TypeError) as e:
                raise ValueError(f"residual_cache.{e}") from None
            object.__setattr__(self, "residual_cache", policy)
        elif self.residual_cache is not None and not isinstance(
            self.residual_cache, ResidualCacheConfig
        ):
            raise ValueError(
                f"residual_cache: must be a mapping of settings or None, "
                f"got {self.residual_cache!r}"
            )
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model: must be a non-empty path, got {self.model!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads: must be >= 1 or None, got {self.num_threads}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(
                f"scheduling_policy: must be one of {POLICIES}, got {self.scheduling_policy!r}"
            )
        if not isinstance(self.admission_control, bool):
            raise ValueError(
                f"admission_control: must be true or false, got {self.admission_control!r}"
            )
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be an integer >= 1, got {self.max_num_seqs!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "dit") -> DiTConfig:
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ValueError(f"{where}.{key}: unknown field; known: {sorted(known)}")
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{where}.{e}") from None


def resolve_device(name: str) -> torch.device:
    """A stage's `device` setting as a torch device ("auto": CUDA when present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
