# SPDX-License-Identifier: Apache-2.0
"""Per-request parameters of a video stage, validated at construction, and what the orchestrator
fills in before a request runs (`resolve_video`) from what the stage declares (its
VideoStageInfo: default shape and frame rate, frame step, frame limit, experts)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vllm_omni.diffusion.params import (
    check_cache_scheduler,
    check_shared_fields,
    check_size_multiple,
    is_finite,
    is_int,
    params_from_dict,
    slo_deadline,
    stage_params,
)
from vllm_omni.errors import FieldError

if TYPE_CHECKING:
    from vllm_omni.diffusion.executor_kind import VideoStageInfo


@dataclass(frozen=True)
class VideoSamplingParams:
    """What a video stage needs to make one video.

    `height`/`width`/`num_frames` of None take the stage's defaults (Wan: 480 x 832, 81
    frames); `num_frames` must be a multiple of the stage's frame step plus 1 (Wan: 4k + 1).
    `guidance_scale` > 1 runs classifier-free guidance against `negative_prompt` (empty if
    None), as diffusers' video pipelines do; `guidance_scale_2` is the second expert's scale of
    a two-expert pipeline (Wan2.2's low-noise one; None: `guidance_scale`). `fps` is the
    playback rate written into the video (it does not change the frames; None: the stage's).
    `seed` of None draws a fresh one.
    `cache_threshold`: this request's first-block residual caching threshold, as for images
    (None: the stage's `residual_cache`; 0: off); step scheduling only.
    `latency_slo_ms` becomes `deadline`, as for images (DiffusionSamplingParams)."""

    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    guidance_scale_2: float | None = None
    negative_prompt: str | None = None
    seed: int | None = None
    fps: float | None = None
    cache_threshold: float | None = None
    latency_slo_ms: float | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        for name in ("height", "width", "num_frames"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value <= 0):
                raise FieldError(name, f"must be a positive integer, got {value!r}")
        for name in ("guidance_scale", "guidance_scale_2"):
            value = getattr(self, name)
            if (value is not None or name == "guidance_scale") and (
                not is_finite(value) or value < 0
            ):
                raise FieldError(name, f"must be a number >= 0, got {value!r}")
        if self.fps is not None and (not is_finite(self.fps) or not 0 < self.fps <= 120):
            raise FieldError("fps", f"must be a number in (0, 120], got {self.fps!r}")
        check_shared_fields(self)

    @property
    def do_cfg(self) -> bool:
        """As the pipelines decide: guidance runs when its scale is above 1."""
        return self.guidance_scale > 1

    @property
    def total_steps(self) -> int:
        return self.num_inference_steps

    @property
    def rows(self) -> int:
        """Transformer rows one step takes: the prompt's, and the negative prompt's under
        guidance."""
        return 2 if self.do_cfg else 1

    def step_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """Videos of one shape share a transformer call, whatever their step, prompt or guidance
        (every row of a call has the same number of tokens)."""
        return (self.num_frames, self.height, self.width)

    def call_key(self, inputs: Mapping[str, Any]) -> Hashable:
        return (self.num_frames, self.height, self.width, self.num_inference_steps)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> VideoSamplingParams:
        return params_from_dict(cls, values, "video")


def resolve_video(
    params: Any, stage: str, scheduler: str, info: VideoStageInfo
) -> VideoSamplingParams:
    """`params` with frames, size, frame rate and seed filled in from the stage's declaration
    and the SLO turned into a deadline; raises FieldError naming the field the stage cannot
    serve."""
    params = stage_params(params, VideoSamplingParams, stage, "a video")
    frames, height, width = info.default_shape
    params = replace(
        params,
        num_frames=params.num_frames or frames,
        height=params.height or height,
        width=params.width or width,
        fps=params.fps or info.default_fps,
        seed=params.seed if params.seed is not None else random.randrange(2**63),
        deadline=slo_deadline(params),
    )
    step = info.frame_step
    if (params.num_frames - 1) % step or params.num_frames > info.max_frames:
        example = ", ".join(str(step * k + 1) for k in range(4))
        raise FieldError(
            "num_frames",
            f"must be {step}k + 1 ({example}, ...) and at most {info.max_frames}, "
            f"got {params.num_frames}",
        )
    check_size_multiple(params, info.size_multiple)
    check_cache_scheduler(params.cache_threshold, stage, scheduler)
    if params.guidance_scale_2 is not None and info.num_experts < 2:
        raise FieldError(
            "guidance_scale_2",
            f"{info.pipeline_class} has one transformer; guidance_scale_2 is the second "
            "expert's (a two-expert pipeline's)",
        )
    return params
