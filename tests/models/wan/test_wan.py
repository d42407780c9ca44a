# SPDX-License-Identifier: Apache-2.0
"""Wan text-to-video (Wan2.1; Wan2.2's two experts) and image-to-video on the tiny pipelines, in
their built-in graph: OmniLLM's frames equal diffusers' own call with the same prompt and seed
(within 2/255), with requests of several prompts, seeds and guidance scales in flight together."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from PIL import Image

from vllm_omni import AsyncOmniLLM, OmniLLM, VideoSamplingParams
from vllm_omni.engine.request_run import StageDelta
from vllm_omni.errors import FieldError

from ...helpers.diffusers_reference import max_pixel_diff, pipeline_video

pytestmark = pytest.mark.engine

MAX_PIXEL_DIFF = 2  # of 255


def picture(seed: int, size: tuple[int, int] = (80, 48)) -> Image.Image:
    """A smooth, seeded RGB picture (width, height)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)).resize(size)


def clip(seed: int, **kw) -> VideoSamplingParams:
    return VideoSamplingParams(
        height=kw.pop("height", 64), width=kw.pop("width", 64), num_frames=kw.pop("num_frames", 9),
        num_inference_steps=kw.pop("steps", 4), seed=seed, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module", params=["wan2.1-t2v", "wan2.2-t2v"])
def text_to_video(request, tiny_models):
    with OmniLLM(tiny_models[request.param]) as omni:
        yield omni, tiny_models[request.param]


def test_text_to_video_equals_diffusers(text_to_video):
    omni, folder = text_to_video
    prompts = ["a red cat on the street", "a blue dog", "the sea at night"]
    second = {"guidance_scale_2": 2.0} if "wan2.2" in str(folder) else {}  # the second expert's
    params = [
        clip(0),  # guidance 5 against the empty negative prompt, the pipeline's default
        clip(1, guidance_scale=1.0),  # no guidance: one row
        clip(2, guidance_scale=3.0, negative_prompt="blurry", **second),
    ]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    for out, prompt, p in zip(outputs, prompts, params):
        assert out.video.shape == (9, 64, 64, 3) and out.video.dtype == np.uint8
        assert out.fps == 16.0
        assert max_pixel_diff(out.video, pipeline_video(folder, prompt, p)) <= MAX_PIXEL_DIFF
    assert not np.array_equal(outputs[0].video, outputs[1].video)


def test_wan22_runs_both_experts(tiny_models):
    """The tiny Wan2.2's 4 steps straddle its boundary, so both experts denoise (the test above
    then shows the switch is diffusers')."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_models["wan2.2-t2v"])
    pipe.scheduler.set_timesteps(4)
    boundary = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
    assert pipe.transformer_2 is not None
    highs = [bool(t >= boundary) for t in pipe.scheduler.timesteps]
    assert any(highs) and not all(highs)


def test_image_to_video_equals_diffusers(tiny_models):
    folder = tiny_models["wan2.1-i2v"]
    images = [picture(1), picture(2, (64, 64))]
    params = [clip(3), clip(4, guidance_scale=1.0)]
    with OmniLLM(folder) as omni:
        outputs = omni.generate(
            [{"prompt": "a red cat", "image": image} for image in images], params, use_tqdm=False
        )
        with pytest.raises(FieldError, match="give the first frame") as e:
            omni.generate("a red cat", clip(0), use_tqdm=False)
        assert e.value.field == "image"
    for out, image, p in zip(outputs, images, params):
        expected = pipeline_video(folder, "a red cat", p, image=image)
        assert max_pixel_diff(out.video, expected) <= MAX_PIXEL_DIFF


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        (dict(num_frames=10), "num_frames", "4k \\+ 1"),
        (dict(height=72), "height", "multiple of 16"),
        (dict(guidance_scale=-1.0), "guidance_scale", ">= 0"),
        (dict(fps=0), "fps", "\\(0, 120\\]"),
    ],
)
def test_bad_parameters_name_the_field(params, field, message, text_to_video):
    omni, _ = text_to_video
    with pytest.raises(FieldError, match=message) as e:
        omni.generate("a cat", clip(0, **params), use_tqdm=False)
    assert e.value.field == field


def test_text_to_video_takes_no_image(text_to_video):
    omni, _ = text_to_video
    with pytest.raises(FieldError, match="takes no input image"):
        omni.generate({"prompt": "a cat", "image": picture(0)}, clip(0), use_tqdm=False)


def test_one_expert_takes_no_second_guidance_scale(tiny_models):
    with OmniLLM(tiny_models["wan2.1-t2v"]) as omni:
        with pytest.raises(FieldError, match="one transformer") as e:
            omni.generate("a cat", clip(0, guidance_scale_2=2.0), use_tqdm=False)
    assert e.value.field == "guidance_scale_2"


def test_progress_is_reported_per_step(tiny_models):
    async def run():
        omni = await AsyncOmniLLM.create(tiny_models["wan2.1-t2v"])
        try:
            events = [e async for e in omni.stream("a cat", clip(0, steps=3))]
        finally:
            omni.shutdown()
        return events

    events = asyncio.run(run())
    progress = [e.data for e in events if isinstance(e, StageDelta) and "progress" in e.data]
    assert [p["step"] for p in progress] == [1, 2, 3]
    assert progress[-1]["progress"] == 1.0 and progress[-1]["total_steps"] == 3
    assert events[-1].output.video.shape[0] == 9
