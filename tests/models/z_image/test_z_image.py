# SPDX-License-Identifier: Apache-2.0
"""Z-Image (the tiny pipeline) in its built-in graph: the Qwen3 text encoder on vLLM up to the
layer the pipeline reads, the DiT step-batched. OmniLLM's images equal diffusers' own call for
each prompt and seed, with and without guidance, batched or alone."""

from __future__ import annotations

import pytest

from vllm_omni import DiffusionSamplingParams, OmniLLM
from vllm_omni.errors import FieldError

from ...helpers.diffusers_reference import max_pixel_diff, pipeline_image

pytestmark = pytest.mark.engine

MAX_PIXEL_DIFF = 2  # of 255
EAGER = {"text_encoder": {"engine_args": {"enforce_eager": True}}}
"""The text encoder uncompiled: a compiled pooling encoder (Qwen-Image's) runs in `make demo`."""


@pytest.fixture(scope="module")
def omni(tiny_models):
    with OmniLLM(tiny_models["z-image"], stage_overrides=EAGER) as omni:
        yield omni


@pytest.fixture(scope="module")
def pipe(tiny_models):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_models["z-image"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_images_equal_the_pipelines_own(omni, pipe):
    prompts = ["a red cat", "a lighthouse at dusk", "two green apples"]
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=4, seed=0),  # 5.0, ""
        DiffusionSamplingParams(
            height=64, width=64, num_inference_steps=3, seed=1, guidance_scale=0.0
        ),
        DiffusionSamplingParams(
            height=48,
            width=80,
            num_inference_steps=3,
            seed=2,
            negative_prompt="blurry",
            guidance_scale=3.0,
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
            height=32, width=32, num_inference_steps=3, seed=i, guidance_scale=float(i % 2)
        )
        for i in range(len(prompts))
    ]
    before = omni.get_stage_stats()["dit"]["num_steps"]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    assert omni.get_stage_stats()["dit"]["num_steps"] - before < len(prompts) * 3
    for prompt, p, out in zip(prompts, params, outputs):
        assert max_pixel_diff(out.images[0], pipeline_image(pipe, prompt, p)) <= MAX_PIXEL_DIFF


def test_a_field_it_cannot_take_is_named(omni):
    p = DiffusionSamplingParams(height=32, width=32, num_inference_steps=2, cache_threshold=0.2)
    with pytest.raises(FieldError) as e:
        omni.generate("a red cat", p, use_tqdm=False)
    assert e.value.field == "cache_threshold"
    out = omni.generate("a red cat", DiffusionSamplingParams(height=32, width=32, seed=0))
    assert out[0].images[0].size == (32, 32)  # the stages keep serving
