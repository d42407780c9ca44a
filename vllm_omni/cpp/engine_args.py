# SPDX-License-Identifier: Apache-2.0
"""Turning CPP on for a vLLM engine: the engine arguments it needs, from Python or the CLI.

    from vllm import LLM
    from vllm_omni.cpp import cpp_engine_args
    llm = LLM(model=M, **cpp_engine_args(pipeline_parallel_size=2))

is the same as plain vLLM with
`--scheduler-cls vllm_omni.cpp.scheduler.CPPScheduler --worker-cls <omni worker for the platform>
 --additional-config '{"cpp": {...}, "omni_worker_hooks": ["cpp"]}'` and a token budget large
enough for CPP's first chunk. Other worker hooks of the engine (a stage's) run inside CPP's.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from typing import Any

from vllm_omni.cpp.config import CONFIG_KEY, CPPConfig

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
"""CPP only ever shrinks chunks below the token budget, so the budget must not bind first."""


def scheduler_cls_name() -> str:
    from vllm_omni.cpp.scheduler import CPPScheduler

    return f"{CPPScheduler.__module__}.{CPPScheduler.__qualname__}"


def cpp_engine_args(
    cpp: CPPConfig | dict[str, Any] | None = None, **engine_args: Any
) -> dict[str, Any]:
    """`engine_args` plus what CPP needs; raises ValueError for combinations CPP cannot run with."""
    from vllm_omni.worker.hooks import with_worker_hooks

    config = cpp if isinstance(cpp, CPPConfig) else CPPConfig.from_dict(cpp)
    if engine_args.get("enable_chunked_prefill") is False:
        raise ValueError(
            "enable_chunked_prefill=False: CPP splits prompts into chunks, "
            "so it needs chunked prefill"
        )
    pp_size = engine_args.get("pipeline_parallel_size", 1)
    for name, off in (("num_steps", None), ("micro_chunks", 1)):
        if pp_size == 1 and getattr(config, name) != off:
            raise ValueError(
                f"cpp.{name} needs pipeline_parallel_size > 1 (chunks pipeline across PP stages)"
            )
    if engine_args.get("scheduler_cls") not in (None, "auto"):
        raise ValueError(
            f"scheduler_cls is set by CPP; it cannot be combined with "
            f"scheduler_cls={engine_args['scheduler_cls']!r}"
        )
    if config.slo:
        config = _install_slo_frontend(config)
    config = _install_cost_model_metrics(config)
    additional = dict(engine_args.pop("additional_config", None) or {})
    additional[CONFIG_KEY] = config.to_dict()
    if config.slo:  # bad per-request SLOs get HTTP 400 (or 429) at the API server
        from vllm_omni.cpp.slo_validation import QUALNAME

        processors = list(engine_args.pop("logits_processors", None) or [])
        engine_args["logits_processors"] = [*processors, QUALNAME]
    args = {
        "max_num_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS,
        **engine_args,
        "enable_chunked_prefill": True,
        "scheduler_cls": scheduler_cls_name(),
        "additional_config": additional,
    }
    try:  # CPP's step timer first: the other hooks see each micro-chunk as a step
        return with_worker_hooks(args, "cpp", first=True)
    except ValueError as e:
        raise ValueError(f"{e} (CPP runs its own worker hook)") from None


def _temp_path(kind: str) -> str:
    return os.path.join(
        tempfile.gettempdir(), f"vllm_omni-{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    )


def _install_cost_model_metrics(config: CPPConfig) -> CPPConfig:
    """/metrics in this (the API server's) process for the cost model the scheduler plans with."""
    from vllm_omni.cpp.cost_model_metrics import install

    if config.status_path is None:
        config = dataclasses.replace(config, status_path=_temp_path("cpp-cost-model"))
    install(config.status_path)
    return config


def _install_slo_frontend(config: CPPConfig) -> CPPConfig:
    """SLO metrics and admission control in this (the API server's) process, reading the ledger
    the scheduler publishes to `config.ledger_path` (a fresh temporary file unless given)."""
    from vllm_omni.cpp.slo import SLOTargets
    from vllm_omni.cpp.slo_frontend import install

    if config.ledger_path is None:
        config = dataclasses.replace(config, ledger_path=_temp_path("slo"))
    defaults = SLOTargets.from_ms(config.ttft_slo_ms, config.tpot_slo_ms)
    install(config.ledger_path, defaults, config.admission)
    return config
