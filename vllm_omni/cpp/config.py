# SPDX-License-Identifier: Apache-2.0
"""CPP configuration: `additional_config={"cpp": {...}}` in vLLM, `--cpp*` flags on
`vllm-omni serve`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

CONFIG_KEY = "cpp"
HANDOFFS = ("free", "rendezvous")


@dataclass(frozen=True, kw_only=True)
class CPPConfig:
    num_steps: int | None = None
    """Pipeline steps per long prefill. None: chosen per prompt from the cost model, minimising
    (m + p - 1) * (T / m + c) (see vllm_omni.cpp.chunking)."""
    chunk_align: int | None = None
    """Chunks are multiples of this many tokens (but the last); None: the KV block size. Chunks
    that end inside a KV block make the next chunk start mid-block, which vLLM's CPU attention
    handles far more slowly (measured: 16-token alignment 15% slower TTFT at 16K-32K than
    128-token blocks, for better balance on paper)."""
    min_chunk: int = 0
    """Smallest prefill chunk in tokens (rounded up to the KV block size); a tail shorter than this
    is merged into the chunk before it."""
    cost_model: str | None = None
    """JSON written by `python -m vllm_omni.cpp.calibrate`. None: the calibration cached for this
    model and pipeline size if there is one, else the analytic FLOP model."""
    overhead_tokens: int = 128
    """For the analytic model only: the fixed cost of a step, in tokens' worth of linear layers."""
    micro_chunks: int = 1
    """The RFC's phase 2: the worker splits each scheduled prefill chunk of a request running
    alone into this many equal-cost micro-chunks that stream through the PP ranks (the scheduler
    plans 1/micro_chunks as many steps). 1: off, every chunk is its own scheduler step (the
    default: measured no faster on CPU, see docs/cpp.md)."""
    handoff: str = "free"
    """How the PP stages pass a chunk on, which a long prefill's plan is cut for: "free" (stages
    buffer: equal-cost chunks) or "rendezvous" (a stage hands a chunk on only when the next stage
    takes it, as vLLM's CPU pipeline does: the plan that costs least under that,
    vllm_omni.cpp.handoff; two stages only). Not the default on CPU yet: measured level with
    fixed 512-token chunks at 16K where equal-cost chunks lost 2.4%; at 32K two runs disagree
    (docs/cpp.md)."""
    lookahead_steps: int = 1
    """Steps scheduled beyond the pp_size in flight, so a stage that finishes finds its next chunk
    queued instead of waiting for the engine's round trip (0: vLLM's own queue of pp_size)."""
    slo: bool = False
    """SLO-aware scheduling (vllm_omni.cpp.slo): prefills share each step's compute budget
    smallest remaining first, a prefill about to miss its TTFT SLO ahead of them; steps are kept
    short enough for the tightest TTFT SLO in play."""
    ttft_slo_ms: float | None = None
    """Default TTFT SLO of requests that set none (`vllm_xargs.ttft_slo_ms`)."""
    tpot_slo_ms: float | None = None
    """Default TPOT SLO of requests that set none (`vllm_xargs.tpot_slo_ms`)."""
    max_wait_s: float = 60.0
    """Starvation guard: a request waiting this long goes first, whatever its slack."""
    admission: bool = False
    """Refuse (HTTP 429) a request whose TTFT SLO cannot be met with the prefill work already
    queued ahead of it (needs a calibrated cost model; see vllm_omni.cpp.slo_frontend)."""
    ledger_path: str | None = None
    """File where the scheduler publishes its SLO ledger for the API server's /metrics and
    admission control; `cpp_engine_args` picks a temporary one when SLO scheduling is on."""

    online_calibration: bool = True
    """Fit the cost model to the steps the engine runs, starting from the model above, and keep
    the fit in the calibration cache (vllm_omni.cpp.online_fit). False: plan with the model above
    as it is."""
    status_path: str | None = None
    """File where the scheduler publishes which cost model it plans with and how well it fits,
    for the API server's /metrics; `cpp_engine_args` picks a temporary one."""

    def __post_init__(self) -> None:
        if self.num_steps is not None and (
            not isinstance(self.num_steps, int) or self.num_steps < 1
        ):
            raise ValueError(
                f"cpp.num_steps must be a positive integer or None, got {self.num_steps!r}"
            )
        if self.chunk_align is not None and (
            not isinstance(self.chunk_align, int) or self.chunk_align < 1
        ):
            raise ValueError(f"cpp.chunk_align must be an integer >= 1, got {self.chunk_align!r}")
        if not isinstance(self.min_chunk, int) or self.min_chunk < 0:
            raise ValueError(f"cpp.min_chunk must be an integer >= 0, got {self.min_chunk!r}")
        if self.cost_model is not None and not isinstance(self.cost_model, str):
            raise ValueError(f"cpp.cost_model must be a path string, got {self.cost_model!r}")
        if (
            isinstance(self.micro_chunks, bool)
            or not isinstance(self.micro_chunks, int)
            or not 1 <= self.micro_chunks <= 64
        ):
            raise ValueError(
                f"cpp.micro_chunks must be an integer in [1, 64], got {self.micro_chunks!r}"
            )
        if self.handoff not in HANDOFFS:
            raise ValueError(f"cpp.handoff must be one of {HANDOFFS}, got {self.handoff!r}")
        if not isinstance(self.lookahead_steps, int) or not 0 <= self.lookahead_steps <= 4:
            raise ValueError(
                f"cpp.lookahead_steps must be an integer in [0, 4], got {self.lookahead_steps!r}"
            )
        if not isinstance(self.slo, bool):
            raise ValueError(f"cpp.slo must be true or false, got {self.slo!r}")
        for name in ("ttft_slo_ms", "tpot_slo_ms"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ValueError(f"cpp.{name} must be a positive number of ms, got {value!r}")
            if value is not None and not self.slo:
                raise ValueError(f"cpp.{name} needs cpp.slo (--cpp-slo)")
        if not isinstance(self.admission, bool):
            raise ValueError(f"cpp.admission must be true or false, got {self.admission!r}")
        if self.admission and not self.slo:
            raise ValueError("cpp.admission needs cpp.slo (--cpp-slo)")
        for name in ("ledger_path", "status_path"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"cpp.{name} must be a path string, got {value!r}")
        if not isinstance(self.online_calibration, bool):
            raise ValueError(
                f"cpp.online_calibration must be true or false, got {self.online_calibration!r}"
            )
        if (
            isinstance(self.max_wait_s, bool)
            or not isinstance(self.max_wait_s, (int, float))
            or (self.max_wait_s <= 0)
        ):
            raise ValueError(f"cpp.max_wait_s must be a positive number, got {self.max_wait_s!r}")
        if not isinstance(self.overhead_tokens, int) or self.overhead_tokens < 0:
            raise ValueError(
                f"cpp.overhead_tokens must be an integer >= 0, got {self.overhead_tokens!r}"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> CPPConfig:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"unknown CPP option cpp.{key}; known options: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_additional_config(cls, additional_config: Any) -> CPPConfig | None:
        """The CPP config in vLLM's additional_config, or None when CPP is not configured."""
        if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
            return None
        return cls.from_dict(additional_config[CONFIG_KEY])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
