# SPDX-License-Identifier: Apache-2.0
"""The body of POST /v1/videos, as the omni server accepts it: OpenAI's multipart form
(`prompt`, `model`, `size`, `seconds`, and `input_reference`: the first frame, a file) plus the
project's extras (`num_frames`, `fps`, `seed`, `num_inference_steps`, `negative_prompt`,
`guidance_scale`, `guidance_scale_2`, `cache_threshold`, `latency_slo_ms`). Form fields arrive
as text and are read as a form's (`"2"` is 2). The server states its limits in the published
schema (videos.py)."""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from vllm_omni.diffusion.executor_kind import VideoStageInfo
from vllm_omni.diffusion.video_params import VideoSamplingParams
from vllm_omni.entrypoints.openai.protocol import (
    MAX_SEED,
    NON_BLANK_PATTERN,
    SIZE_PATTERN,
    StrictBody,
    _on_string,
    matching,
    non_blank,
)

SECONDS_PATTERN = r"^([1-9][0-9]{0,2}(\.[0-9]{1,3})?|0\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9]))$"
"""A positive number of seconds under 1000, at most 3 decimals: '4', '2.5', '0.25'."""


class VideoCreateRequest(StrictBody):
    prompt: str = Field(json_schema_extra=_on_string(minLength=1, pattern=NON_BLANK_PATTERN))
    model: str | None = None
    size: str | None = Field(
        None,
        description="WIDTHxHEIGHT in pixels, e.g. '832x480' (default: the model's). Width and "
        "height must be multiples of `x-size-multiple` (the model's), and width * height at "
        "most `x-max-pixels` (the server's --max-image-pixels).",
        json_schema_extra=_on_string(pattern=SIZE_PATTERN),
    )
    seconds: str | None = Field(
        None,
        description="Duration, e.g. '4': num_frames is seconds x fps rounded to a multiple of "
        "`x-frame-step` (the model's) plus 1, unless num_frames is given. Default: the model's "
        "frame count.",
        json_schema_extra=_on_string(pattern=SECONDS_PATTERN),
    )
    num_frames: int | None = Field(
        None,
        ge=1,
        description="Frames to make: a multiple of `x-frame-step` (the model's) plus 1, at most "
        "the server's --max-video-frames. Overrides seconds.",
    )
    fps: float | None = Field(
        None, gt=0, le=120, allow_inf_nan=False, description="Playback rate (default: the model's)"
    )
    seed: int | None = Field(None, ge=0, lt=MAX_SEED)
    num_inference_steps: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Denoising steps (default 50), at most `x-max-request-steps` (the "
        "server's --max-request-steps)",
    )
    negative_prompt: str | None = None
    guidance_scale: float | None = Field(None, ge=0, allow_inf_nan=False)
    guidance_scale_2: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="The second (low-noise) expert's guidance scale, for models whose "
        "denoising steps two experts split",
    )
    cache_threshold: float | None = Field(
        None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="First-block residual caching threshold for this job (0: off; default: "
        "the server's --dit-cache)",
    )
    latency_slo_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    user: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: str) -> str:
        return non_blank(value)

    @field_validator("size")
    @classmethod
    def _size_format(cls, value: str | None) -> str | None:
        return matching(SIZE_PATTERN, value, "must be 'WIDTHxHEIGHT', e.g. '832x480'")

    @field_validator("seconds")
    @classmethod
    def _seconds_format(cls, value: str | None) -> str | None:
        return matching(
            SECONDS_PATTERN, value, "must be a positive number of seconds, e.g. '4' or '2.5'"
        )

    def sampling_params(self, info: VideoStageInfo) -> VideoSamplingParams:
        """The video's parameters for the stage `info` declares (FieldError naming a field the
        stage cannot take)."""
        fps = self.fps or info.default_fps
        frames = self.num_frames
        if frames is None and self.seconds is not None:
            frames = frames_for(float(self.seconds), fps, info.frame_step)
        width, height = map(int, self.size.split("x")) if self.size else (None, None)
        values = {
            "height": height,
            "width": width,
            "num_frames": frames,
            "fps": fps,
            "seed": self.seed,
            "num_inference_steps": self.num_inference_steps,
            "negative_prompt": self.negative_prompt,
            "guidance_scale": self.guidance_scale,
            "guidance_scale_2": self.guidance_scale_2,
            "cache_threshold": self.cache_threshold,
            "latency_slo_ms": self.latency_slo_ms,
        }
        return VideoSamplingParams(**{k: v for k, v in values.items() if v is not None})


def frames_for(seconds: float, fps: float, step: int) -> int:
    """The frame count `step` k + 1 nearest to `seconds` at `fps` (at least 1)."""
    return step * max(0, math.floor(seconds * fps / step + 0.5)) + 1
