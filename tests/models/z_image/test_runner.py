# SPDX-License-Identifier: Apache-2.0
"""Z-Image's DiT stage (the framework's step loop over ZImageRunner) in this process, fed the
embeddings transformers' encoder gives (the rows the pipeline reads: hidden_states[-2]):
step-wise and whole-request runs both make `ZImagePipeline`'s images, whatever the requests run
beside them."""

from __future__ import annotations

import pytest
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTSchedulerOutput
from vllm_omni.models.z_image.kinds import ZImageDiT, ZImageSamplingParams

from ...helpers.diffusers_reference import max_pixel_diff, pipeline_image


@pytest.fixture(scope="module")
def pipe(tiny_models):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_models["z-image"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _request(pipe, rid: str, prompt: str, p: ZImageSamplingParams) -> DiTRequest:
    with torch.inference_mode():
        embeds, negative = pipe.encode_prompt(
            prompt, do_classifier_free_guidance=p.guidance_scale > 0, negative_prompt=""
        )
    inputs = {"prompt_embeds": embeds[0]}
    if p.guidance_scale > 0:
        inputs["negative_prompt_embeds"] = negative[0]
    return DiTRequest(rid, p, inputs)


@pytest.mark.parametrize("mode", ["step", "fifo"])
def test_the_executor_makes_the_pipelines_images(tiny_models, pipe, mode):
    config = DiTConfig(model=str(tiny_models["z-image"]))
    executor = ZImageDiT().build(config, DiTCacheManager(), pipe)
    params = {
        "a": ZImageSamplingParams(
            height=32, width=32, num_inference_steps=3, seed=0, guidance_scale=4.0
        ),
        "b": ZImageSamplingParams(
            height=32, width=32, num_inference_steps=2, seed=1, guidance_scale=0.0
        ),
    }
    prompts = {"a": "a red cat", "b": "a lighthouse at dusk"}
    requests = {rid: _request(pipe, rid, prompts[rid], p) for rid, p in params.items()}
    out = executor.execute_model(DiTSchedulerOutput(mode, ["a", "b"], [["a", "b"]]), requests)
    for _ in range(2):  # step mode: b finishes after one more step, a after two
        running = [rid for rid in params if rid not in out.finished]
        if running:
            more = executor.execute_model(DiTSchedulerOutput(mode, [], [running]), requests)
            out.finished.update(more.finished)
    assert set(out.finished) == {"a", "b"}
    for rid, p in params.items():
        theirs = pipeline_image(pipe, prompts[rid], p)
        assert max_pixel_diff(out.finished[rid], theirs) <= 2, rid
