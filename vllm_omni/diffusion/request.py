# SPDX-License-Identifier: Apache-2.0
"""A request as the DiT stage sees it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from vllm_omni.diffusion.params import Code2WavParams, DiffusionSamplingParams


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
    params: DiffusionSamplingParams | Code2WavParams
    inputs: dict[str, torch.Tensor]
    arrival: float = field(default_factory=time.monotonic)
    status: DiTRequestStatus = DiTRequestStatus.WAITING
    num_steps_done: int = 0
    last_advanced_step: int = 0  # the scheduler's engine step when it last ran (or arrived)

    @property
    def deadline(self) -> float | None:
        """Wall-clock time (time.time()) by which the result is due; None: no SLO."""
        return getattr(self.params, "deadline", None)

    @property
    def shape_key(self) -> tuple:
        """Requests with equal keys can share a transformer call in step mode."""
        if isinstance(self.params, Code2WavParams):
            return self.pipeline_key
        return (self.params.height, self.params.width)

    @property
    def pipeline_key(self) -> tuple:
        """Requests with equal keys can share one whole-pipeline call (request mode)."""
        p = self.params
        if isinstance(p, Code2WavParams):
            # One batch needs equal code counts (no padding: the DiT attends over every frame)
            # and one voice (its reference mel sets the shape of the speaker input).
            num_codes = (
                int(self.inputs["codec_tokens"].numel()) if "codec_tokens" in self.inputs else -1
            )
            return (
                "code2wav",
                num_codes,
                p.voice,
                p.num_steps,
                p.guidance_scale,
                p.sway_coefficient,
            )
        return (p.height, p.width, p.num_inference_steps, p.true_cfg_scale, p.do_cfg, p.output_type)

    @property
    def num_steps(self) -> int:
        """Denoising steps of the whole request."""
        p = self.params
        return p.num_steps if isinstance(p, Code2WavParams) else p.num_inference_steps

    @property
    def is_finished(self) -> bool:
        return self.status in (DiTRequestStatus.FINISHED, DiTRequestStatus.ABORTED)
