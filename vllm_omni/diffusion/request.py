# SPDX-License-Identifier: Apache-2.0
"""A request as the process stage's loop sees it."""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


class DiTRequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class DiTRequest:
    """`params` is resolved (size and seed filled in) and follows the ProcessParams protocol
    (vllm_omni.diffusion.executor_kind). `inputs` holds the named tensors that arrived over the
    stage graph's edges (e.g. `prompt_embeds`), or for a stage with no source the request's
    prompt inputs (tensors, text such as `prompt`, and input images as a list of arrays)."""

    request_id: str
    params: Any
    inputs: dict[str, torch.Tensor | str | list[np.ndarray]]
    arrival: float = field(default_factory=time.monotonic)
    status: DiTRequestStatus = DiTRequestStatus.WAITING
    num_steps_done: int = 0
    last_advanced_step: int = 0  # the scheduler's engine step when it last ran (or arrived)

    @property
    def deadline(self) -> float | None:
        """Wall-clock time (time.time()) by which the result is due; None: no SLO."""
        return self.params.deadline

    @property
    def shape_key(self) -> Hashable:
        """Requests with equal keys can share a model call in step mode."""
        return self.params.step_key(self.inputs)

    @property
    def pipeline_key(self) -> Hashable:
        """Requests with equal keys can share one whole-request call (fifo mode)."""
        return self.params.call_key(self.inputs)

    @property
    def num_steps(self) -> int:
        """Denoising steps of the whole request."""
        return self.params.total_steps
