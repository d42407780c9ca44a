# SPDX-License-Identifier: Apache-2.0
"""AuraFlow (the tiny pipeline, by its hub name) in its built-in graph: one process stage on the
framework's step loop. OmniLLM's images equal diffusers' own call for each prompt, seed, step
count and guidance, with the requests in flight together."""

from __future__ import annotations

import pytest

from vllm_omni import DiffusionSamplingParams, OmniLLM
from vllm_omni.errors import FieldError

from ...helpers.diffusers_reference import max_pixel_diff, pipeline_image
from ...helpers.hub import offline_hub_at

pytestmark = pytest.mark.engine

MAX_PIXEL_DIFF = 2  # of 255
REPO = "fal/AuraFlow-v0.3"


@pytest.fixture(scope="module")
def omni(hub_cache):
    with offline_hub_at(hub_cache), OmniLLM(REPO) as omni:
        yield omni


@pytest.fixture(scope="module")
def pipe(tiny_models):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_models["aura-flow"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_images_equal_the_pipelines_own(omni, pipe):
    prompts = ["a red cat", "a lighthouse at dusk", "two green apples"]
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=4, seed=0),  # 3.5, ""
        DiffusionSamplingParams(
            height=64, width=64, num_inference_steps=3, seed=1, guidance_scale=1.0
        ),
        DiffusionSamplingParams(
            height=48,
            width=80,
            num_inference_steps=2,
            seed=2,
            negative_prompt="blurry",
            guidance_scale=5.0,
        ),
    ]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    for prompt, p, out in zip(prompts, params, outputs):
        theirs = pipeline_image(pipe, prompt, p)
        assert out.images[0].size == (p.width, p.height)
        assert max_pixel_diff(out.images[0], theirs) <= MAX_PIXEL_DIFF, prompt


def test_requests_share_denoising_steps(omni, pipe):
    """Four prompts of one size, three steps each, some guided: fewer engine steps than the
    twelve they take one by one, each image still the pipeline's."""
    prompts = ["a red cat", "a blue dog", "a green frog", "a yellow bird"]
    params = [
        DiffusionSamplingParams(
            height=32, width=32, num_inference_steps=3, seed=i, guidance_scale=1.0 + 3 * (i % 2)
        )
        for i in range(len(prompts))
    ]
    before = omni.get_stage_stats()["dit"]["num_steps"]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    assert omni.get_stage_stats()["dit"]["num_steps"] - before < len(prompts) * 3
    for prompt, p, out in zip(prompts, params, outputs):
        assert max_pixel_diff(out.images[0], pipeline_image(pipe, prompt, p)) <= MAX_PIXEL_DIFF


@pytest.mark.parametrize(
    ("fields", "field"),
    [(dict(cache_threshold=0.2), "cache_threshold"), (dict(height=40), "height")],
)
def test_a_field_it_cannot_take_is_named(omni, fields, field):
    p = DiffusionSamplingParams(width=32, num_inference_steps=2, **{"height": 32, **fields})
    with pytest.raises(FieldError) as e:
        omni.generate("a red cat", p, use_tqdm=False)
    assert e.value.field == field
    out = omni.generate("a red cat", DiffusionSamplingParams(height=32, width=32, seed=0))
    assert out[0].images[0].size == (32, 32)  # the stage keeps serving
