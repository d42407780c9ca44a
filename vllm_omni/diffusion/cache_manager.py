# SPDX-License-Identifier: Apache-2.0
"""Per-request state of a DiT stage: latents, prompt embeddings, the sampler's step state.

Everything a request holds on the DiT side lives in one entry, so finishing or aborting a
request frees all of it in one place (`release`), and the engine can report exactly what is
held (`num_entries`, `num_bytes`) - the DiT counterpart of vLLM's KV block accounting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class DiTCacheConfig:
    """`max_bytes`: tensor bytes the cache may hold (None: unbounded); admission waits beyond it.
    `ttl_s`: entries untouched for this long are dropped by `clear_expired` (a safety net for
    requests whose owner vanished; normal requests are released when they finish)."""

    max_bytes: int | None = None
    ttl_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"max_bytes: must be positive or None, got {self.max_bytes}")
        if self.ttl_s <= 0:
            raise ValueError(f"ttl_s: must be positive, got {self.ttl_s}")


@dataclass
class DiTCacheEntry:
    """`on_release`: frees what the request holds outside its tensors (a paused pipeline run),
    called once when the entry goes, however it goes."""

    tensors: dict[str, torch.Tensor]
    state: dict[str, Any] = field(default_factory=dict)  # non-tensor step state (sampler, ...)
    touched: float = field(default_factory=time.monotonic)
    on_release: Callable[[], None] | None = None

    def release(self) -> None:
        if self.on_release is not None:
            self.on_release, on_release = None, self.on_release
            on_release()

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class DiTCacheManager:
    def __init__(self, config: DiTCacheConfig | None = None) -> None:
        self.config = config or DiTCacheConfig()
        self._entries: dict[str, DiTCacheEntry] = {}

    def can_allocate(self, num_bytes: int, pending_entries: int = 0) -> bool:
        """Whether `num_bytes` more fit; `pending_entries` were admitted but not allocated."""
        if self.config.max_bytes is None or not (self._entries or pending_entries):
            return True  # an empty cache always admits one request, however large
        return self.num_bytes + num_bytes <= self.config.max_bytes

    def allocate(
        self,
        request_id: str,
        tensors: dict[str, torch.Tensor],
        on_release: Callable[[], None] | None = None,
        **state: Any,
    ) -> DiTCacheEntry:
        if request_id in self._entries:
            raise ValueError(f"request_id: {request_id!r} already has a DiT cache entry")
        entry = DiTCacheEntry(tensors=dict(tensors), state=dict(state), on_release=on_release)
        self._entries[request_id] = entry
        return entry

    def get(self, request_id: str) -> DiTCacheEntry | None:
        entry = self._entries.get(request_id)
        if entry is not None:
            entry.touched = time.monotonic()
        return entry

    def release(self, request_id: str) -> bool:
        entry = self._entries.pop(request_id, None)
        if entry is None:
            return False
        entry.release()
        return True

    def clear_expired(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        expired = [rid for rid, e in self._entries.items() if now - e.touched > self.config.ttl_s]
        for rid in expired:
            self.release(rid)
        return expired

    def clear(self) -> None:
        for rid in list(self._entries):
            self.release(rid)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    @property
    def num_bytes(self) -> int:
        return sum(e.num_bytes for e in self._entries.values())
