# SPDX-License-Identifier: Apache-2.0
"""A stage's diffusers pipeline, loaded as its DiTConfig says."""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni.diffusion.config import DiTConfig


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
