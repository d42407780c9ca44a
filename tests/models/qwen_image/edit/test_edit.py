# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit and Edit-Plus (the tiny pipelines) in their built-in graph: Qwen2.5-VL reads
the prompt with the input images on vLLM, the DiT runs step-batched with the images' VAE latents.
OmniLLM's edits equal diffusers' own call with the same images, prompt and seed, its encoder
given the model's image positions (vllm_omni.models.qwen_image.edit.reference)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_omni import DiffusionSamplingParams, OmniLLM
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.edit.reference import with_image_positions

from ....helpers.diffusers_reference import max_pixel_diff, pipeline_image
from ....helpers.media import picture

pytestmark = pytest.mark.engine

MAX_PIXEL_DIFF = 2  # of 255


def reference_pipeline(folder):
    from diffusers import DiffusionPipeline

    pipe = with_image_positions(DiffusionPipeline.from_pretrained(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference(folder, prompt: str, image, params: DiffusionSamplingParams) -> np.ndarray:
    return pipeline_image(reference_pipeline(folder), prompt, params, image=image)


EAGER = {"text_encoder": {"engine_args": {"enforce_eager": True}}}
"""The text encoder uncompiled: the compiled path runs in `make demo` (CI runs it first)."""


@pytest.fixture(scope="module", params=[("qwen-image-edit", 1), ("qwen-image-edit-plus", 2)])
def edit_model(request, tiny_models):
    name, num_images = request.param
    with OmniLLM(tiny_models[name], stage_overrides=EAGER) as omni:
        yield omni, tiny_models[name], num_images


def test_edits_equal_diffusers(edit_model):
    omni, folder, num_images = edit_model
    images = [picture(i) for i in range(num_images)]
    image = images[0] if num_images == 1 else images
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=3, seed=5),
        DiffusionSamplingParams(
            height=48, width=80, num_inference_steps=2, seed=6, negative_prompt=" "
        ),
    ]
    outputs = omni.generate([{"prompt": "make it red", "image": image}] * 2, params, use_tqdm=False)
    pipe = reference_pipeline(folder)
    for p, out in zip(params, outputs):
        ours = np.asarray(out.images[0])
        theirs = pipeline_image(pipe, "make it red", p, image=image)
        assert ours.shape == theirs.shape == (p.height, p.width, 3)
        assert max_pixel_diff(ours, theirs) <= MAX_PIXEL_DIFF


def test_equal_edits_share_denoising_steps(edit_model):
    """Four edits of one input size and output size, three steps each: fewer engine steps than
    the twelve they would take one by one, and each still the edit it is alone."""
    omni, folder, num_images = edit_model
    image = [picture(7)] * num_images
    prompts = ["make it red", "add a hat", "make it night", "add rain"]
    params = [
        DiffusionSamplingParams(height=32, width=32, num_inference_steps=3, seed=i)
        for i in range(len(prompts))
    ]
    before = omni.get_stage_stats()["dit"]["num_steps"]
    outputs = omni.generate(
        [{"prompt": p, "image": image} for p in prompts], params, use_tqdm=False
    )
    assert omni.get_stage_stats()["dit"]["num_steps"] - before < len(prompts) * 3
    alone = omni.generate({"prompt": prompts[2], "image": image}, params[2], use_tqdm=False)
    assert max_pixel_diff(outputs[2].images[0], alone[0].images[0]) <= MAX_PIXEL_DIFF


def test_the_residual_cache_serves_edits(edit_model):
    """Edits run the first-block cached forward: with a threshold no step meets it gives the
    plain forward's edit, and with one that steps meet it serves rows from the cache. (The tiny
    random-weight transformer's first-block residual changes by about its own size from step
    to step, so only the loosest threshold, 1.0, caches; a trained one changes far less.)"""
    omni, _, num_images = edit_model
    image = [picture(4)] * num_images

    def edit(steps: int, threshold: float):
        p = DiffusionSamplingParams(
            height=16, width=16, num_inference_steps=steps, seed=4, cache_threshold=threshold
        )
        return omni.generate({"prompt": "add rain", "image": image}, p, use_tqdm=False)[0]

    assert max_pixel_diff(edit(6, 1e-6).images[0], edit(6, 0.0).images[0]) <= 1
    before = omni.get_stage_stats()["dit"]["residual_cached_rows"]
    assert edit(40, 1.0).images[0].size == (16, 16)
    assert omni.get_stage_stats()["dit"]["residual_cached_rows"] > before


def test_edits_of_other_input_sizes_run_in_their_own_batches(edit_model):
    """One output size, input images of two sizes: their latents' sequences differ in length,
    so the two never share a transformer call, and each is the edit it is alone."""
    omni, _, num_images = edit_model
    p = DiffusionSamplingParams(height=32, width=32, num_inference_steps=2, seed=1)
    inputs = [[picture(1, size)] * num_images for size in ((80, 64), (64, 96))]
    together = omni.generate(
        [{"prompt": "add a hat", "image": images} for images in inputs], [p, p], use_tqdm=False
    )
    for images, out in zip(inputs, together):
        alone = omni.generate({"prompt": "add a hat", "image": images}, p, use_tqdm=False)[0]
        assert max_pixel_diff(out.images[0], alone.images[0]) <= MAX_PIXEL_DIFF


def test_bad_edits_name_the_field(edit_model):
    omni, _, _ = edit_model
    p = DiffusionSamplingParams(height=32, width=32, num_inference_steps=2, seed=0)
    guided = DiffusionSamplingParams(height=32, width=32, num_inference_steps=2, guidance_scale=3)
    cases = [
        ("make it red", p, "image"),  # an edit needs its image
        ({"prompt": "x", "image": [picture(0)] * 4}, p, "image"),  # at most 1 (Edit-Plus: 3)
        ({"prompt": "x", "image": "picture.png"}, p, "image"),
        ({"prompt": "x", "image": picture(0)}, guided, "guidance_scale"),  # not distilled
    ]
    for prompt, params, field in cases:
        with pytest.raises(FieldError) as e:
            omni.generate(prompt, params, use_tqdm=False)
        assert e.value.field == field, (prompt, e.value)
    out = omni.generate({"prompt": "x", "image": picture(0)}, p, use_tqdm=False)[0]
    assert out.images[0].size == (32, 32)  # the stages keep serving


def test_default_size_is_the_pipelines(edit_model):
    """The last input image's aspect at about 1024x1024, as diffusers picks it."""
    omni, _, _ = edit_model
    inputs, params = omni.engine.prepare({"prompt": "x", "image": picture(0, (200, 100))})
    assert (params["dit"].height, params["dit"].width) == (736, 1440)
