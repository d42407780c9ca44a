# SPDX-License-Identifier: Apache-2.0
"""Pipelines no family claims, by the hub ids users type (the tiny pipelines in a hub cache,
offline): FLUX.1 dev and schnell, FLUX.2 klein, Sana and Lumina 2, each request running the
pipeline's own call,
step-batched. OmniLLM's images equal each pipeline's own call for that prompt and seed alone,
with requests of other step counts, guidance, negative prompts and sizes in flight together, and
the requests share denoising steps."""

from __future__ import annotations

import pytest

from vllm_omni import DiffusionSamplingParams, OmniLLM
from vllm_omni.errors import FieldError

from ...helpers.diffusers_reference import max_pixel_diff, pipeline_image
from ...helpers.hub import offline_hub_at

pytestmark = pytest.mark.engine

MAX_PIXEL_DIFF = 2  # of 255
MODELS = {  # hub id: (tiny model, another size it takes, whether it takes a negative prompt)
    "black-forest-labs/FLUX.1-dev": ("flux-dev", (48, 80), True),
    "black-forest-labs/FLUX.1-schnell": ("flux-schnell", (48, 80), True),
    "black-forest-labs/FLUX.2-klein-4B": ("flux2-klein", (48, 80), False),  # guidance-distilled
    "Efficient-Large-Model/Sana_1600M_1024px_diffusers": ("sana", (64, 128), True),
    "Alpha-VLLM/Lumina-Image-2.0": ("lumina2", (48, 80), True),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def repo(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def omni(repo, hub_cache):
    with offline_hub_at(hub_cache), OmniLLM(repo) as omni:
        yield omni


@pytest.fixture(scope="module")
def pipe(repo, tiny_models):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_models[MODELS[repo][0]])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_images_equal_the_pipelines_own_and_share_steps(repo, omni, pipe):
    _, (height, width), takes_negative = MODELS[repo]
    negative = {"guidance_scale": 2.0, "negative_prompt": "blurry"} if takes_negative else {}
    prompts = ["a red cat", "a lighthouse at dusk", "two green apples"]
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=3, seed=0),
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=2, seed=1, **negative),
        DiffusionSamplingParams(height=height, width=width, num_inference_steps=3, seed=2),
    ]
    before = omni.get_stage_stats()["pipeline"]["num_steps"]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    engine_steps = omni.get_stage_stats()["pipeline"]["num_steps"] - before
    for prompt, p, out in zip(prompts, params, outputs):
        theirs = pipeline_image(pipe, prompt, p)
        assert out.images[0].size == (p.width, p.height)
        assert max_pixel_diff(out.images[0], theirs) <= MAX_PIXEL_DIFF, prompt
    assert engine_steps < sum(p.num_inference_steps for p in params)  # 8 one after another
    if not takes_negative:  # a field the pipeline does not take is refused, naming it
        refused = DiffusionSamplingParams(height=64, width=64, negative_prompt="blurry")
        with pytest.raises(FieldError, match="negative_prompt"):
            omni.generate(["a cat"], refused, use_tqdm=False)
