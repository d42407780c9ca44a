# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics of the omni server: per-stage queues, step latency and time per request,
images made.

Kept in a registry of the app's own (several apps can live in one test process); /metrics
serves it together with vLLM's default registry (the AR stage engines' `vllm:*` metrics).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vllm_omni.outputs import StageTiming

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
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
        self.stage_seconds = Histogram(
            "vllm_omni:stage_request_seconds",
            "Time one request spent at a stage: 'queued' waiting for one of the stage's "
            "in-flight slots (back-pressure), 'running' from handing it in until its result "
            "came back (the stage's own queue and scheduling included)",
            ["stage", "phase"],
            buckets=STAGE_BUCKETS,
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
        self.residual_rows = Gauge(
            "vllm_omni:dit_residual_cache_row_steps",
            "Denoising row-steps of a DiT stage since start, by whether the residual cache "
            "served them (cached) or every block ran (computed)",
            ["stage", "outcome"],
            registry=r,
        )
        self.slo_requests = Gauge(
            "vllm_omni:dit_slo_requests",
            "Requests with a latency SLO that a DiT stage finished in time (met), late "
            "(missed), or refused at admission (rejected), since start",
            ["stage", "outcome"],
            registry=r,
        )
        self.slack = Gauge(
            "vllm_omni:dit_slo_slack_seconds",
            "Median slack (deadline minus finish time) of a DiT stage's last 256 SLO requests",
            labels,
            registry=r,
        )
        self.kv_usage = Gauge(
            "vllm_omni:kv_cache_usage_perc",
            "KV cache usage of an AR stage (0-1)",
            labels,
            registry=r,
        )

    def observe_step(self, stage: str, seconds: float) -> None:
        self.step_seconds.labels(stage).observe(seconds)

    def observe_stage(self, stage: str, timing: StageTiming) -> None:
        self.stage_seconds.labels(stage, "queued").observe(timing.start - timing.queued)
        self.stage_seconds.labels(stage, "running").observe(timing.end - timing.start)

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
            if "residual_cached_rows" in s:
                self.residual_rows.labels(stage, "cached").set(s["residual_cached_rows"])
                self.residual_rows.labels(stage, "computed").set(s["residual_computed_rows"])
            if "slo_met" in s:
                for outcome in ("met", "missed", "rejected"):
                    self.slo_requests.labels(stage, outcome).set(s[f"slo_{outcome}"])
                self.slack.labels(stage).set(s["slo_slack_p50_s"])
            if "kv_cache_usage" in s:
                self.kv_usage.labels(stage).set(s["kv_cache_usage"])
