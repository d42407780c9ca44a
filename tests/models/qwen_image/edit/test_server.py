# SPDX-License-Identifier: Apache-2.0
"""`vllm serve Qwen/Qwen-Image-Edit --omni` (the tiny pipeline under the real name): OpenAI's
`images.edit` through the official client equals diffusers' own call (its encoder given the
model's image positions); bad uploads get 400."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import requests
from PIL import Image

from vllm_omni.diffusion.params import DiffusionSamplingParams

from ....helpers.media import picture
from ....helpers.server import BIN, ServerProcess
from .test_edit import MAX_PIXEL_DIFF, reference

pytestmark = pytest.mark.engine

MODEL = "Qwen/Qwen-Image-Edit"
MAX_PIXELS = 256 * 256


@pytest.fixture(scope="module")
def server(hub_env):
    command = [str(BIN / "vllm"), "serve", MODEL, "--omni", "--max-image-pixels", str(MAX_PIXELS)]
    command.append("--enforce-eager")  # compiled: `make demo` (CI runs it before the tests)
    with ServerProcess(command, env=hub_env) as server:
        yield server


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_openai_images_edit_equals_diffusers(server, tiny_models):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    image = picture(0)
    result = client.images.edit(
        model=MODEL,
        image=("picture.png", png(image), "image/png"),
        prompt="make it red",
        size="64x48",
        n=2,
        extra_body={"seed": 5, "num_inference_steps": 3},
    )
    assert len(result.data) == 2
    for i, item in enumerate(result.data):
        ours = np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json))))
        params = DiffusionSamplingParams(height=48, width=64, num_inference_steps=3, seed=5 + i)
        theirs = reference(tiny_models["qwen-image-edit"], "make it red", image, params)
        diff = np.abs(ours.astype(int) - theirs.astype(int)).max()
        assert diff <= MAX_PIXEL_DIFF, (i, diff)


def _post(server, files: list, **fields) -> requests.Response:
    data = {"prompt": "make it red", "num_inference_steps": "2", "size": "64x64", **fields}
    return requests.post(f"{server.url}/v1/images/edits", data=data, files=files, timeout=120)


@pytest.mark.parametrize(
    "files, fields, param",
    [
        ([("image", ("notes.txt", b"not an image", "text/plain"))], {}, "image"),
        ([], {}, "image"),
        ([("image", ("big.png", png(picture(0, (512, 512))), "image/png"))], {}, "image"),
        ([("image[]", ("a.png", png(picture(0)), "image/png"))] * 2, {}, "image"),
        (
            [
                ("image", ("a.png", png(picture(0)), "image/png")),
                ("mask", ("m.png", png(picture(1)), "image/png")),
            ],
            {},
            "mask",
        ),
        (
            [("image", ("a.png", png(picture(0)), "image/png"))],
            {"frequency_of_cats": "3"},
            "frequency_of_cats",
        ),
        ([("image", ("a.png", png(picture(0)), "image/png"))], {"size": "72x64"}, "size"),
        ([("image", ("a.png", png(picture(0)), "image/png"))], {"n": "lots"}, "n"),
    ],
)
def test_bad_uploads_get_400_naming_the_field(server, files, fields, param):
    response = _post(server, files, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200


def test_the_schema_states_the_form(server):
    schema = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    form = schema["paths"]["/v1/images/edits"]["post"]["requestBody"]["content"]
    properties = form["multipart/form-data"]["schema"]["properties"]
    assert {"image", "prompt", "n", "size", "seed", "true_cfg_scale"} <= set(properties)
    assert "guidance_scale" not in properties  # Qwen-Image-Edit is not guidance-distilled


def _check_edit_reply(body: dict, reply: dict) -> None:
    n = body.get("n", 1)
    assert len(reply["data"]) == n, reply
    for item in reply["data"]:
        assert base64.b64decode(item["b64_json"][:12]).startswith(b"\x89PNG")


def test_fuzz_edit_forms_from_the_published_schema(server):
    """Forms generated from the published schema: valid ones are edited (at least 90%, and any
    refusal names a field it sent), invalid ones get a 400 naming a field they violate; never
    a 5xx, and the server stays up."""
    from ....helpers.openapi_fuzz import fuzz_form_operation

    openapi = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    form = openapi["paths"]["/v1/images/edits"]["post"]["requestBody"]["content"]
    size = form["multipart/form-data"]["schema"]["properties"]["size"]
    sides = range(size["x-size-multiple"], 64 + 1, size["x-size-multiple"])
    small = {"type": "integer", "minimum": 1, "maximum": 2}
    cheap = {
        "size": {"enum": [f"{w}x{h}" for w in sides for h in sides]},
        "n": small,
        "num_inference_steps": small,
        "latency_slo_ms": {"type": "number", "minimum": 600_000, "maximum": 10**9},
    }
    tally = fuzz_form_operation(
        server.url,
        {},
        openapi,
        "/v1/images/edits",
        files={"image": ("picture.png", png(picture(0, (40, 32))), "image/png")},
        cheap=cheap,
        check_ok=_check_edit_reply,
        positive_examples=12,
        negative_examples=40,
    )
    print(tally)
    assert tally.valid == 12 and tally.invalid == 40
    assert tally.accepted_fraction >= 0.9, tally
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200


def test_the_schema_states_the_image_limits(server):
    schema = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    form = schema["paths"]["/v1/images/edits"]["post"]["requestBody"]["content"]
    one, many = form["multipart/form-data"]["schema"]["properties"]["image"]["anyOf"]
    assert one["x-max-pixels"] == many["items"]["x-max-pixels"] == MAX_PIXELS
    assert one["maxLength"] == 16 * 2**20
    assert many["maxItems"] == 1  # Qwen-Image-Edit edits one image
