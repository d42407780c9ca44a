# SPDX-License-Identifier: Apache-2.0
"""The DiT stage in-process (no vLLM): its images equal diffusers' for the same embeddings."""

from __future__ import annotations

import pytest
import torch

from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.engine_core import DiffusionEngineCore
from vllm_omni.diffusion.params import DiffusionSamplingParams

from ..helpers.diffusers_reference import load_pipeline, max_pixel_diff, reference_image

PROMPTS = ["a red cat on a blue sofa", "a lighthouse", "two green apples on a wooden table today"]


@pytest.fixture(scope="module")
def pipe(tiny_models):
    return load_pipeline(tiny_models["qwen-image"])


def _embeds(pipe, prompt: str) -> torch.Tensor:
    embeds, _ = pipe.encode_prompt(prompt, device=torch.device("cpu"))
    return embeds[0]


def _run(core: DiffusionEngineCore, requests: dict) -> dict:
    for rid, (inputs, params) in requests.items():
        core.add_request(rid, inputs, params)
    results = {}
    while core.has_unfinished_requests():
        finished, _, _ = core.step()
        results.update({r.request_id: out for r, out in finished})
    assert core.cache.num_entries == 0
    return results


@pytest.mark.parametrize("mode", ["step", "fifo"])
def test_matches_diffusers(pipe, tiny_models, mode: str) -> None:
    core = DiffusionEngineCore(DiTConfig(model=str(tiny_models["qwen-image"])), mode, "qwen_image")
    params = [
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=3, seed=7),
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=2, seed=8),
        DiffusionSamplingParams(
            height=64, width=64, num_inference_steps=3, seed=9, negative_prompt="blurry"
        ),
    ]
    requests = {}
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        inputs = {"prompt_embeds": _embeds(pipe, prompt)}
        if p.negative_prompt:
            inputs["negative_prompt_embeds"] = _embeds(pipe, p.negative_prompt)
        requests[f"r{i}"] = (inputs, p)
    results = _run(core, requests)
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        ours = results[f"r{i}"]
        ref = reference_image(pipe, prompt, p)
        assert ours.shape == ref.shape == (64, 64, 3)
        diff = max_pixel_diff(ours, ref)
        assert diff <= 2, f"request {i}: max pixel difference {diff}"
