# SPDX-License-Identifier: Apache-2.0
"""Where the CPP scheduler's cost model comes from: an explicit file, a cached calibration for
this model and pipeline size, or the analytic FLOP count."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.cost_model import CostModel, ModelShape
from vllm_omni.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

CACHE_ENV = "VLLM_OMNI_CACHE_DIR"


def calibration_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "vllm_omni")) / "cpp"


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


def resolve_cost_model(config: CPPConfig, vllm_config: VllmConfig) -> CostModel:
    if config.cost_model is not None:
        return CostModel.load(config.cost_model)
    cached = calibration_path_for(vllm_config)
    if cached.is_file():
        logger.info("CPP: using the calibrated cost model %s", cached)
        return CostModel.load(cached)
    logger.info(
        "CPP: no calibration for this model at %s; using the analytic FLOP model "
        "(run `python -m vllm_omni.cpp.calibrate MODEL -pp N` to calibrate)",
        cached,
    )
    return analytic_cost_model(vllm_config, config.overhead_tokens)
