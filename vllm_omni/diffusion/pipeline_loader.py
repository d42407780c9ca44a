# SPDX-License-Identifier: Apache-2.0
"""A stage's diffusers pipeline, loaded as its DiTConfig says."""

from __future__ import annotations

import time
from typing import Any

import torch

from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.logger import init_logger

logger = init_logger(__name__)


def load_pipeline(config: DiTConfig, device: torch.device, without: tuple[str, ...] = ()) -> Any:
    """`config.model`'s pipeline in `config.dtype` on `device`, its progress bars off, without
    the components named in `without` (those another stage runs, e.g. the text encoder)."""
    from diffusers import DiffusionPipeline

    kwargs: dict[str, Any] = {name: None for name in without}
    if config.dtype != "auto":
        kwargs["torch_dtype"] = getattr(torch, config.dtype)
    pipe = DiffusionPipeline.from_pretrained(config.model, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def stage_pipeline(
    config: DiTConfig, device: torch.device, pipe: Any = None, without: tuple[str, ...] = ()
) -> Any:
    """A stage's pipeline: `pipe` moved to `device` where one is given (a pipeline built in
    memory), else `load_pipeline`; logs what was loaded and how long it took."""
    start = time.perf_counter()
    pipe = load_pipeline(config, device, without) if pipe is None else pipe.to(device)
    logger.info(
        "process stage: loaded %s (%s) on %s in %.1f s",
        config.model,
        type(pipe).__name__,
        device,
        time.perf_counter() - start,
    )
    return pipe
