# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics of the omni server: per-stage queues and step latency, images made.

Kept in a registry of the app's own (several apps can live in one test process); /metrics
serves it together with vLLM's default registry (the AR stage engines' `vllm:*` metrics).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class OmniMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "vllm_omni:requests",
            "Requests by endpoint and outcome",
            ["endpoint", "status"],
            registry=r,
        )
        self.images = Counter("vllm_omni:images_generated", "Images returned", registry=r)
        self.latency = Histogram(
            "vllm_omni:request_latency_seconds",
            "End-to-end request latency",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step_seconds = Histogram(
            "vllm_omni:stage_step_seconds",
            "Wall time of one engine step of a diffusion stage",
            ["stage"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        labels = ["stage"]
        self.waiting = Gauge(
            "vllm_omni:stage_requests_waiting", "Requests queued in a stage", labels, registry=r
        )
        self.running = Gauge(
            "vllm_omni:stage_requests_running", "Requests a stage is running", labels, registry=r
        )
        self.cache_entries = Gauge(
            "vllm_omni:dit_cache_entries", "Requests holding DiT cache entries", labels, registry=r
        )
        self.cache_bytes = Gauge(
            "vllm_omni:dit_cache_bytes", "Bytes held by the DiT cache", labels, registry=r
        )
        self.kv_usage = Gauge(
            "vllm_omni:kv_cache_usage_perc",
            "KV cache usage of an AR stage (0-1)",
            labels,
            registry=r,
        )

    def update_from_stats(self, stats: dict[str, Any]) -> None:
        """Refresh the gauges from OmniEngine.stats() (called on each scrape)."""
        for stage, s in stats.items():
            if stage == "requests":
                continue
            if "num_waiting" in s:
                self.waiting.labels(stage).set(s["num_waiting"])
            if "num_running" in s:
                self.running.labels(stage).set(s["num_running"])
            if "cache_entries" in s:
                self.cache_entries.labels(stage).set(s["cache_entries"])
                self.cache_bytes.labels(stage).set(s["cache_bytes"])
            if "kv_cache_usage" in s:
                self.kv_usage.labels(stage).set(s["kv_cache_usage"])
