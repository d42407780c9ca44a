# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit and Edit-Plus (the tiny pipelines, served whole): OmniLLM's edits equal
diffusers' own call with the same image, prompt and seed."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vllm_omni import DiffusionSamplingParams, OmniLLM
from vllm_omni.errors import FieldError

from ...helpers.diffusers_reference import pipeline_image

MAX_PIXEL_DIFF = 2  # of 255


def picture(seed: int, size: tuple[int, int] = (80, 64)) -> Image.Image:
    """A smooth, seeded RGB picture (width, height)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize(size, Image.BILINEAR)


def reference(folder, prompt: str, image, params: DiffusionSamplingParams) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipeline_image(pipe, prompt, params, image=image)


@pytest.mark.parametrize("name, num_images", [("qwen-image-edit", 1), ("qwen-image-edit-plus", 2)])
def test_edit_equals_diffusers(tiny_models, name, num_images):
    folder = tiny_models[name]
    images = [picture(i) for i in range(num_images)]
    image = images[0] if num_images == 1 else images
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=3, seed=5),
        DiffusionSamplingParams(
            height=48, width=80, num_inference_steps=2, seed=6, negative_prompt=" "
        ),
    ]
    with OmniLLM(folder) as omni:
        outputs = omni.generate(
            [{"prompt": "make it red", "image": image}] * 2, params, use_tqdm=False
        )
        with pytest.raises(FieldError) as e:  # an edit needs its image
            omni.generate("make it red", params[0], use_tqdm=False)
        assert e.value.field == "image"
        with pytest.raises(FieldError, match="at most") as e:
            omni.generate({"prompt": "x", "image": [picture(0)] * 4}, params[0], use_tqdm=False)
        assert e.value.field == "image"
    for p, out in zip(params, outputs):
        ours = np.asarray(out.images[0])
        theirs = reference(folder, "make it red", image, p)
        assert ours.shape == theirs.shape == (p.height, p.width, 3)
        diff = np.abs(ours.astype(int) - theirs.astype(int)).max()
        assert diff <= MAX_PIXEL_DIFF, (name, diff)


def test_default_size_follows_the_input_image():
    from vllm_omni.models.diffusers_pipeline.kinds import edit_size

    assert edit_size((2048, 1024), (1024, 1024), 16) == (720, 1456)  # (height, width)
    assert edit_size((64, 64), (1024, 1024), 16) == (1024, 1024)
    assert edit_size((10, 1000), (64, 64), 16) == (640, 16)  # tall and narrow
