# SPDX-License-Identifier: Apache-2.0
"""A video request's parameters are filled in and checked by what its stage declares (frame
step, frame rate, frame limit, experts), not by one family's numbers: a made-up stage with a
frame step of 8 at 24 fps and one expert shows it."""

from __future__ import annotations

import pytest

from vllm_omni.diffusion.executor_kind import VideoKind, VideoStageInfo
from vllm_omni.diffusion.video_params import VideoSamplingParams
from vllm_omni.entrypoints.openai.video_protocol import VideoCreateRequest
from vllm_omni.errors import FieldError

INFO = VideoStageInfo(
    default_shape=(17, 64, 96),
    size_multiple=32,
    frame_step=8,
    default_fps=24.0,
    image_to_video=False,
    pipeline_class="SomeVideoPipeline",
    max_frames=65,
)


def validate(**fields) -> VideoSamplingParams:
    return VideoKind().validate(VideoSamplingParams(**fields), "dit", "step", INFO)


def test_defaults_come_from_the_stage() -> None:
    p = validate(seed=1)
    assert (p.num_frames, p.height, p.width, p.fps) == (17, 64, 96, 24.0)
    assert validate(num_frames=9, fps=12.0).fps == 12.0


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (dict(num_frames=5), "num_frames", r"8k \+ 1 \(1, 9, 17, 25, \.\.\.\)"),
        (dict(num_frames=73), "num_frames", "at most 65"),
        (dict(height=48), "height", "multiple of 32"),
        (dict(guidance_scale_2=3.0), "guidance_scale_2", "one transformer"),
        (dict(cache_threshold=0.2), "cache_threshold", "step-level scheduling"),
    ],
)
def test_what_the_stage_cannot_take_names_the_field(fields, field, message) -> None:
    scheduler = "fifo" if "cache_threshold" in fields else "step"
    with pytest.raises(FieldError, match=message) as e:
        VideoKind().validate(VideoSamplingParams(**fields), "dit", scheduler, INFO)
    assert e.value.field == field


def test_two_experts_take_a_second_guidance_scale() -> None:
    from dataclasses import replace

    two = replace(INFO, num_experts=2)
    p = VideoKind().validate(VideoSamplingParams(guidance_scale_2=3.0), "dit", "step", two)
    assert p.guidance_scale_2 == 3.0


def test_seconds_become_frames_at_the_stages_step_and_rate() -> None:
    body = VideoCreateRequest(prompt="a cat", seconds="1")
    assert body.sampling_params(INFO).num_frames == 25  # 24 frames at 24 fps, to 8k + 1
    body = VideoCreateRequest(prompt="a cat", seconds="1", fps=8)
    assert body.sampling_params(INFO).num_frames == 9


def test_a_stage_declares_a_sane_split() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="num_experts"):
        replace(INFO, num_experts=3)
    with pytest.raises(ValueError, match="frame_step"):
        replace(INFO, frame_step=0)
