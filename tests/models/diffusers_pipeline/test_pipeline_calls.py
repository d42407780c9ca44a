# SPDX-License-Identifier: Apache-2.0
"""Diffusers pipelines no family claims, each request running the pipeline's own call, step-batched
(the tiny Stable Diffusion 3; Z-Image and Qwen-Image-Edit through graphs that name the executor):
OmniLLM's images equal the pipeline's own call for each prompt and seed alone, and requests of
other step counts and guidance share denoising steps."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_omni import DiffusionSamplingParams, OmniLLM
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.graph import pipeline_graph

from ...helpers.diffusers_reference import pipeline_image

MAX_PIXEL_DIFF = 2  # of 255


@pytest.fixture(scope="module", params=["sd3", "z-image"])
def model(request, tiny_models):
    return tiny_models[request.param]


@pytest.fixture(scope="module")
def omni(model):
    # SD3 by its built-in graph (no family claims it); Z-Image's family runs it in stages, so
    # it runs through a graph naming the executor
    graph = pipeline_graph("z_image", "diffusers_pipeline") if "z-image" in str(model) else None
    with OmniLLM(model, stage_configs=graph) as omni:
        yield omni


@pytest.fixture(scope="module")
def pipe(model):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_images_equal_the_pipelines_own(omni, pipe):
    prompts = ["a red cat", "a lighthouse at dusk", "two green apples"]
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=4, seed=0),
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=4, seed=1),
        DiffusionSamplingParams(
            height=48,
            width=80,
            num_inference_steps=3,
            seed=2,
            negative_prompt="blurry",
            guidance_scale=5.0,
        ),
    ]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    for prompt, p, out in zip(prompts, params, outputs):
        ours = np.asarray(out.images[0])
        theirs = pipeline_image(pipe, prompt, p)
        assert ours.shape == theirs.shape == (p.height, p.width, 3)
        diff = np.abs(ours.astype(int) - theirs.astype(int)).max()
        assert diff <= MAX_PIXEL_DIFF, (prompt, diff)
        assert out.seed == p.seed
    assert not np.array_equal(np.asarray(outputs[0].images[0]), np.asarray(outputs[1].images[0]))


def test_requests_of_other_steps_and_guidance_share_steps(omni):
    """4 + 2 + 3 steps of one size in 4 engine steps (5 where the others arrive a step after the
    first), not 9: each step runs the requests at it in one batched denoiser call."""
    prompts = ["a red cat", "a boat", "a tree"]
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=4, seed=0),
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=2, seed=1),
        DiffusionSamplingParams(
            height=64, width=64, num_inference_steps=3, seed=2, guidance_scale=3.0
        ),
    ]
    before = omni.get_stage_stats()["pipeline"]["num_steps"]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    assert all(out.images for out in outputs)
    assert omni.get_stage_stats()["pipeline"]["num_steps"] - before in (4, 5)


DEFAULT_SIZES = {
    "StableDiffusion3Pipeline": (64, 64),  # its transformer's sample_size 8 x the VAE's factor 8
    "ZImagePipeline": (1024, 1024),  # says none: the common 1024
}


def test_default_size_is_the_pipelines(omni, pipe):
    default = DEFAULT_SIZES[type(pipe).__name__]
    assert omni.engine.stages["pipeline"].info.default_size == default
    if default == (64, 64):
        out = omni.generate("a red cat", DiffusionSamplingParams(num_inference_steps=2, seed=0))
        assert out[0].images[0].size == default


@pytest.mark.parametrize(
    "params, field",
    [
        (DiffusionSamplingParams(height=72, num_inference_steps=2), "height"),
        (DiffusionSamplingParams(output_type="latent", num_inference_steps=2), "output_type"),
        (DiffusionSamplingParams(cache_threshold=0.2, num_inference_steps=2), "cache_threshold"),
    ],
)
def test_parameters_the_pipeline_cannot_take_name_the_field(omni, params, field):
    with pytest.raises(FieldError) as e:
        omni.generate("a red cat", params, use_tqdm=False)
    assert e.value.field == field


def test_a_request_without_text_is_refused(omni):
    with pytest.raises(FieldError) as e:
        omni.generate({"negative_prompt": "blurry"}, use_tqdm=False)
    assert e.value.field == "prompt"
    # the stage keeps serving
    out = omni.generate("a red cat", DiffusionSamplingParams(num_inference_steps=2, seed=0))[0]
    assert out.images


def test_an_editing_pipeline_equals_its_own_call(tiny_models):
    """Any editing pipeline runs by its own call: here Qwen-Image-Edit through a graph that
    names the executor (its family's graph runs it in stages instead)."""
    from diffusers import DiffusionPipeline

    from ...helpers.media import picture

    folder = tiny_models["qwen-image-edit"]
    graph = pipeline_graph("qwen_image_edit", "diffusers_pipeline")
    p = DiffusionSamplingParams(height=32, width=48, num_inference_steps=2, seed=3)
    with OmniLLM(folder, stage_configs=graph) as omni:
        out = omni.generate({"prompt": "make it red", "image": picture(0)}, p, use_tqdm=False)
        with pytest.raises(FieldError, match="at most 1") as e:
            omni.generate({"prompt": "x", "image": [picture(0)] * 2}, p, use_tqdm=False)
        assert e.value.field == "image"
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    theirs = pipeline_image(pipe, "make it red", p, image=picture(0))
    assert np.abs(np.asarray(out[0].images[0]).astype(int) - theirs.astype(int)).max() <= 2
