# SPDX-License-Identifier: Apache-2.0
"""Image models by name through `vllm serve NAME --omni` (the tiny pipelines under the real
names): Z-Image (its Qwen3 on vLLM, the DiT step-batched), AuraFlow (one process stage,
step-batched) and a pipeline no family claims, Stable Diffusion 3.5 (its own call, step-batched).
The OpenAI Images API through the official openai client gives the images diffusers' own call
makes; bad requests get 400 naming the field."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import requests
import torch
from PIL import Image

from ..helpers.server import BIN, ServerProcess

pytestmark = pytest.mark.engine

MODELS = {
    "Tongyi-MAI/Z-Image-Turbo": "z-image",
    "fal/AuraFlow-v0.3": "aura-flow",
    "stabilityai/stable-diffusion-3.5-medium": "sd3",
}
MAX_PIXEL_DIFF = 2  # of 255


@pytest.fixture(scope="module", params=sorted(MODELS))
def server(request, hub_env):
    # --enforce-eager: Z-Image's text encoder uncompiled (a compiled pooling encoder, Qwen-Image's,
    # runs in `make demo`)
    command = [str(BIN / "vllm"), "serve", request.param, "--omni", "--enforce-eager"]
    with ServerProcess(command, env=hub_env) as server:
        server.model = request.param
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_image_equals_diffusers(server, client, tiny_models):
    from diffusers import DiffusionPipeline

    extra = {"seed": 3, "num_inference_steps": 3, "guidance_scale": 2.0}
    extra["negative_prompt"] = "blurry"
    result = client.images.generate(
        model=server.model, prompt="a red cat", size="64x48", n=2, extra_body=extra
    )
    pipe = DiffusionPipeline.from_pretrained(tiny_models[MODELS[server.model]])
    pipe.set_progress_bar_config(disable=True)
    for i, item in enumerate(result.data):
        ours = np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json))))
        with torch.inference_mode():
            theirs = pipe(
                "a red cat",
                height=48,
                width=64,
                num_inference_steps=3,
                guidance_scale=2.0,
                negative_prompt="blurry",
                generator=torch.Generator().manual_seed(3 + i),  # image i gets seed + i
            ).images[0]
        assert ours.shape == (48, 64, 3)
        diff = np.abs(ours.astype(int) - np.asarray(theirs).astype(int)).max()
        assert diff <= MAX_PIXEL_DIFF, (i, diff)


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"size": "72x64"}, "size"),
        ({"guidance_scale": -1}, "guidance_scale"),
        ({"cache_threshold": 0.2}, "cache_threshold"),
    ],
)
def test_bad_requests_get_400_naming_the_field(server, extra, field):
    body = {"prompt": "a red cat", "num_inference_steps": 2, "size": "64x64", **extra}
    response = requests.post(f"{server.url}/v1/images/generations", json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
