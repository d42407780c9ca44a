# SPDX-License-Identifier: Apache-2.0
"""Per-request parameters of a stage that makes audio from a prompt (sound, music), validated at
construction, and what the orchestrator fills in before a request runs (`resolve_audio`) from
what the stage declares (its AudioStageInfo: sample rate, channels, default and longest clip)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vllm_omni.diffusion.params import (
    check_cache_scheduler,
    check_shared_fields,
    is_finite,
    params_from_dict,
    slo_deadline,
    stage_params,
)
from vllm_omni.errors import FieldError

if TYPE_CHECKING:
    from vllm_omni.diffusion.executor_kind import AudioStageInfo


@dataclass(frozen=True)
class AudioSamplingParams:
    """What an audio stage needs to make one clip.

    `seconds` of None takes the stage's default length (at most its longest). `guidance_scale`
    of None takes the pipeline's own default; above 1 it runs classifier-free guidance against
    `negative_prompt` (empty if None). `seed` of None draws a fresh one. `cache_threshold` and
    `latency_slo_ms` (which becomes `deadline`) as for images (DiffusionSamplingParams)."""

    seconds: float | None = None
    num_inference_steps: int = 50
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    seed: int | None = None
    cache_threshold: float | None = None
    latency_slo_ms: float | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.seconds is not None and (not is_finite(self.seconds) or self.seconds <= 0):
            raise FieldError("seconds", f"must be a positive number, got {self.seconds!r}")
        g = self.guidance_scale
        if g is not None and (not is_finite(g) or g < 0):
            raise FieldError("guidance_scale", f"must be None or a number >= 0, got {g!r}")
        check_shared_fields(self)

    @property
    def total_steps(self) -> int:
        return self.num_inference_steps

    @property
    def rows(self) -> int:
        """Denoiser rows one step takes: two under guidance (the pipelines' defaults guide)."""
        return 1 if self.guidance_scale is not None and self.guidance_scale <= 1 else 2

    def step_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """Every clip may share a step: calls whose latents differ in shape (lengths of a
        pipeline that sizes its latents by the clip) run as separate forwards of that step."""
        return ()

    def call_key(self, inputs: Mapping[str, Any]) -> Hashable:
        return (self.seconds, self.num_inference_steps)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AudioSamplingParams:
        return params_from_dict(cls, values, "audio")


def resolve_audio(
    params: Any, stage: str, scheduler: str, info: AudioStageInfo
) -> AudioSamplingParams:
    """`params` with the length and seed filled in from the stage's declaration and the SLO
    turned into a deadline; raises FieldError naming the field the stage cannot serve."""
    params = stage_params(params, AudioSamplingParams, stage, "an audio")
    params = replace(
        params,
        seconds=params.seconds or info.default_seconds,
        seed=params.seed if params.seed is not None else random.randrange(2**63),
        deadline=slo_deadline(params),
    )
    if params.seconds > info.max_seconds:
        raise FieldError(
            "seconds",
            f"{info.pipeline_class} makes clips of at most {info.max_seconds:g} s, "
            f"got {params.seconds:g}",
        )
    check_cache_scheduler(params.cache_threshold, stage, scheduler)
    return params
