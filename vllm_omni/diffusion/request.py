# SPDX-License-Identifier: Apache-2.0
"""A request as the DiT stage sees it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from vllm_omni.diffusion.params import DiffusionSamplingParams


class DiTRequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class DiTRequest:
    """`params` is resolved: size and seed are filled in. `inputs` holds the named tensors
    that arrived over the stage graph's edges (e.g. `prompt_embeds`)."""

    request_id: str
    params: DiffusionSamplingParams
    inputs: dict[str, torch.Tensor]
    arrival: float = field(default_factory=time.monotonic)
    status: DiTRequestStatus = DiTRequestStatus.WAITING
    num_steps_done: int = 0

    @property
    def shape_key(self) -> tuple[int, int]:
        """Requests with equal keys can share a transformer call in step mode."""
        return (self.params.height, self.params.width)

    @property
    def pipeline_key(self) -> tuple:
        """Requests with equal keys can share one whole-pipeline call (request mode)."""
        p = self.params
        return (p.height, p.width, p.num_inference_steps, p.true_cfg_scale, p.do_cfg, p.output_type)

    @property
    def is_finished(self) -> bool:
        return self.status in (DiTRequestStatus.FINISHED, DiTRequestStatus.ABORTED)
