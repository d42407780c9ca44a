# SPDX-License-Identifier: Apache-2.0
"""Where the CPP scheduler's cost model comes from: an explicit file, a cached calibration for
this model and pipeline size, or the analytic FLOP count."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.cost_model import CostModel, ModelShape
from vllm_omni.logger import init_logger
from vllm_omni.platform.cache_dir import cache_root

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


def calibration_dir() -> Path:
    return cache_root() / "cpp"


def calibration_key(model: str, pp_size: int, dtype: str, device: str) -> str:
    """Calibrations are per machine (this cache), model folder, pipeline size, dtype and device."""
    ident = json.dumps([os.path.realpath(model), pp_size, dtype, device], sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def calibration_path(model: str, pp_size: int, dtype: str, device: str) -> Path:
    """Where the calibration of `model` at `pp_size` stages is cached (see calibration_key)."""
    return calibration_dir() / f"{calibration_key(model, pp_size, dtype, device)}.json"


def calibration_path_for(vllm_config: VllmConfig) -> Path:
    model_config = vllm_config.model_config
    return calibration_path(
        model_config.model,
        vllm_config.parallel_config.pipeline_parallel_size,
        str(model_config.dtype),
        vllm_config.device_config.device_type,
    )


def analytic_cost_model(vllm_config: VllmConfig, overhead_tokens: int) -> CostModel:
    shape = ModelShape.from_hf_config(vllm_config.model_config.hf_text_config)
    flops = CostModel.analytic(shape, pp_size=vllm_config.parallel_config.pipeline_parallel_size)
    return CostModel(
        linear=flops.linear,
        attention=flops.attention,
        step_overhead=overhead_tokens * flops.linear,
        unit=flops.unit,
    )


@dataclass(frozen=True)
class StartingModel:
    model: CostModel
    source: str
    """"file" (`cpp.cost_model`), "cached" (a calibration or an online fit) or "analytic"."""
    fitted_steps: int | None = None
    """Steps an online fit came from (None: not an online fit)."""


def resolve_cost_model(config: CPPConfig, vllm_config: VllmConfig) -> CostModel:
    return starting_cost_model(config, vllm_config).model


def starting_cost_model(config: CPPConfig, vllm_config: VllmConfig) -> StartingModel:
    """The model a CPP engine starts from: the file given, else the cache, else FLOPs."""
    if config.cost_model is not None:
        model, fit = CostModel.load_with_fit(config.cost_model)
        return StartingModel(model, "file", (fit or {}).get("num_steps"))
    cached = calibration_path_for(vllm_config)
    if cached.is_file():
        model, fit = CostModel.load_with_fit(cached)
        how = f"online fit of {fit.get('num_steps')} steps" if fit else "calibration"
        logger.info("CPP: starting from the cached cost model %s (%s)", cached, how)
        return StartingModel(model, "cached", (fit or {}).get("num_steps"))
    logger.info(
        "CPP: no cost model cached for this model at %s; starting from the analytic FLOP model "
        "and fitting one to the steps as they run",
        cached,
    )
    return StartingModel(analytic_cost_model(vllm_config, config.overhead_tokens), "analytic")
