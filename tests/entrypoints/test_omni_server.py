# SPDX-License-Identifier: Apache-2.0
"""`vllm serve <Qwen-Image folder> --omni`: the OpenAI Images API over the stage graph, tested
with the official openai client against a live server on loopback."""

from __future__ import annotations

import base64
import io
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import requests
from PIL import Image

from vllm_omni.diffusion.params import DiffusionSamplingParams

from ..helpers.diffusers_reference import load_pipeline, max_pixel_diff, reference_image
from ..helpers.openapi_fuzz import fuzz_operation
from ..helpers.server import BIN, ServerProcess

pytestmark = pytest.mark.engine

API_KEY = "test-key"
FAST = {"num_inference_steps": 2}
MAX_PIXELS = 512 * 512  # --max-image-pixels; the disconnect test asks for exactly 512x512
MAX_REQUEST_STEPS = 1000  # --max-request-steps; the disconnect test asks for 1000 steps


@pytest.fixture(scope="module")
def server(hub_env):
    command = [
        str(BIN / "vllm"),
        "serve",
        "Qwen/Qwen-Image",  # the tiny model under the real name, in a hub cache (offline)
        "--omni",
        "--enforce-eager",
        "--served-model-name",
        "tiny-qwen-image",
        "--api-key",
        API_KEY,
        "--max-image-pixels",
        str(MAX_PIXELS),
        "--max-request-steps",
        str(MAX_REQUEST_STEPS),
        # The deadline policy serves requests without an SLO too (infinite slack): every test
        # here runs under it; the default (fcfs) runs in test_omni_llm.py and the others.
        "--dit-scheduling-policy",
        "deadline",
        "--dit-admission-control",
        "--shutdown-timeout",  # the last test: SIGTERM lets the request in flight finish
        "60",
    ]
    with ServerProcess(command, env=hub_env, api_key=API_KEY) as server:
        yield server
        # Stop it here, to read what it printed while shutting down.
        server.proc.terminate()
        server.proc.wait(timeout=60)
        log = server.log_text()
    # Python's resource tracker reports shared memory (or semaphores) that a process of the
    # server created and never released: a process was killed before it cleaned up.
    assert "leaked shared_memory" not in log and "leaked semaphore" not in log, log[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def _image(item) -> Image.Image:
    raw = base64.b64decode(item.b64_json)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return Image.open(io.BytesIO(raw))


def _metric(server, name: str, **labels) -> float:
    text = requests.get(f"{server.url}/metrics", headers=server.headers, timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as prometheus writes them
    pattern = "^" + re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def test_images_come_back_as_png_of_the_requested_size(client, tiny_models) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny-qwen-image"]
    result = client.images.generate(
        model="tiny-qwen-image",
        prompt="a red cat on a blue sofa",
        size="96x64",
        n=2,
        response_format="b64_json",
        extra_body={"seed": 5, **FAST},
    )
    images = [_image(item) for item in result.data]
    assert [im.size for im in images] == [(96, 64), (96, 64)]
    assert max_pixel_diff(images[0], images[1]) > 0  # n images get seeds 5 and 6
    pipe = load_pipeline(tiny_models["qwen-image"])
    p = DiffusionSamplingParams(width=96, height=64, num_inference_steps=2, seed=5)
    assert max_pixel_diff(images[0], reference_image(pipe, "a red cat on a blue sofa", p)) <= 2


def test_concurrent_requests(client) -> None:
    def one(i: int):
        r = client.images.generate(
            prompt=f"picture {i}", size="64x64", extra_body={"seed": i, **FAST}
        )
        return np.asarray(_image(r.data[0]))

    with ThreadPoolExecutor(8) as pool:
        images = list(pool.map(one, range(8)))
    assert all(im.shape == (64, 64, 3) for im in images)
    again = one(3)
    assert max_pixel_diff(again, images[3]) <= 2  # same seed: same image, up to batch rounding


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "size": "64x70"}, "size"),
        ({"prompt": "x", "size": "large"}, "size"),
        ({"prompt": "x", "size": "064x64"}, "size"),
        ({"prompt": " \n\t"}, "prompt"),
        ({"prompt": "x", "size": "8192x8192"}, "size"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 11}, "n"),
        ({"prompt": "x", "n": "2"}, "n"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "x", "response_format": "url"}, "response_format"),
        ({"prompt": "x", "num_inference_steps": 0}, "num_inference_steps"),
        ({"prompt": "x", "seed": -1}, "seed"),
        ({"prompt": "x", "cache_threshold": 1.5}, "cache_threshold"),
        ({"prompt": "x", "latency_slo_ms": 0}, "latency_slo_ms"),
        ({"prompt": "x", "colour": "red"}, "colour"),
        ({"size": "64x64"}, "prompt"),
        # Work per request: n x num_inference_steps <= --max-request-steps.
        (
            {"prompt": "x", "size": "64x64", "n": 9, "num_inference_steps": 446},
            "num_inference_steps",
        ),
    ],
)
def test_bad_input_is_400_naming_the_field(server, body, param) -> None:
    r = requests.post(
        f"{server.url}/v1/images/generations", json=body, headers=server.headers, timeout=30
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{param}:")
    assert requests.get(f"{server.url}/health", headers=server.headers).status_code == 200


def test_openai_client_sees_bad_request(client) -> None:
    with pytest.raises(openai.BadRequestError, match="size"):
        client.images.generate(prompt="x", size="64x70")


def test_api_key_guards_the_api_routes(server) -> None:
    """As on vLLM's server: /v1 needs the key; probes and scrapers do not."""
    for path in ("/health", "/metrics"):
        assert requests.get(f"{server.url}{path}", timeout=30).status_code == 200, path
    for method, path in [
        ("get", "/v1/models"),
        ("post", "/v1/images/generations"),
        ("post", "/v1/chat/completions"),
    ]:
        r = requests.request(method, f"{server.url}{path}", json={"prompt": "x"}, timeout=30)
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error"
        r = requests.request(
            method,
            f"{server.url}{path}",
            timeout=30,
            headers={"Authorization": "Bearer wrong"},
            json={"prompt": "x"},
        )
        assert r.status_code == 401, path
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_disconnect_cancels_and_frees_the_dit_cache(server) -> None:
    cancelled_before = _metric(
        server, "vllm_omni:requests_total", endpoint="images", status="cancelled"
    )
    cancelled_before = 0.0 if np.isnan(cancelled_before) else cancelled_before
    # Minutes of work at 512x512 on this CPU: only a cancellation frees it within the test.
    body = {"prompt": "a very slow cat", "size": "512x512", "num_inference_steps": 1000}

    def slow_request():
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(
                f"{server.url}/v1/images/generations",
                json=body,
                headers=server.headers,
                timeout=(5, 6),
            )

    thread = threading.Thread(target=slow_request)
    thread.start()
    deadline = time.monotonic() + 30
    while _metric(server, "vllm_omni:dit_cache_entries", stage="dit") != 1:
        assert time.monotonic() < deadline, "the request never reached the DiT stage"
        time.sleep(0.2)
    thread.join()  # the client gave up and closed its connection
    deadline = time.monotonic() + 30
    while _metric(server, "vllm_omni:dit_cache_entries", stage="dit") != 0:
        assert time.monotonic() < deadline, "the DiT cache entry was not freed"
        time.sleep(0.2)
    assert (
        _metric(server, "vllm_omni:requests_total", endpoint="images", status="cancelled")
        == cancelled_before + 1
    )
    assert _metric(server, "vllm_omni:stage_requests_running", stage="dit") == 0


def test_metrics(server, client) -> None:
    client.images.generate(prompt="x", size="64x64", extra_body=FAST)
    assert _metric(server, "vllm_omni:images_generated_total") >= 1
    assert _metric(server, "vllm_omni:stage_step_seconds_count", stage="dit") >= 2
    for stage in ("text_encoder", "dit"):  # each request's time at each stage
        labels = {"stage": stage, "phase": "running"}
        assert _metric(server, "vllm_omni:stage_request_seconds_count", **labels) >= 1
        assert _metric(server, "vllm_omni:stage_request_seconds_sum", **labels) > 0
    assert _metric(server, "vllm_omni:stage_requests_waiting", stage="dit") == 0
    assert _metric(server, "vllm_omni:kv_cache_usage_perc", stage="text_encoder") == 0


def test_request_opts_into_residual_caching(server, client) -> None:
    """`cache_threshold` per request (the server runs without --dit-cache): the DiT stage
    serves some of the request's steps from its residual cache, and /metrics counts them."""

    def row_steps(outcome: str) -> float:
        value = _metric(
            server, "vllm_omni:dit_residual_cache_row_steps", stage="dit", outcome=outcome
        )
        return 0.0 if value != value else value  # not yet exported: none so far

    before = row_steps("cached") + row_steps("computed"), row_steps("cached")
    result = client.images.generate(
        prompt="a lighthouse",
        size="64x64",
        extra_body={"seed": 3, "num_inference_steps": 12, "cache_threshold": 1.0},
    )
    assert _image(result.data[0]).size == (64, 64)
    assert row_steps("cached") + row_steps("computed") - before[0] == 12
    assert row_steps("cached") > before[1]


def test_unreachable_latency_slo_is_429_and_the_server_stays_up(server, client) -> None:
    client.images.generate(prompt="x", size="128x128", extra_body={"seed": 1, **FAST})  # priced
    body = {"prompt": "x", "size": "128x128", "latency_slo_ms": 0.001, **FAST}
    r = requests.post(
        f"{server.url}/v1/images/generations", json=body, headers=server.headers, timeout=60
    )
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert error["param"] == "latency_slo_ms" and error["type"] == "rate_limit_exceeded"
    assert _metric(server, "vllm_omni:dit_slo_requests", outcome="rejected", stage="dit") >= 1
    met = _metric(server, "vllm_omni:dit_slo_requests", outcome="met", stage="dit")
    reachable = {"seed": 2, "latency_slo_ms": 60_000, **FAST}
    client.images.generate(prompt="x", size="128x128", extra_body=reachable)
    assert _metric(server, "vllm_omni:dit_slo_requests", outcome="met", stage="dit") == met + 1


def test_chat_completions_return_the_image(client) -> None:
    reply = client.chat.completions.create(
        model="tiny-qwen-image",
        messages=[
            {"role": "system", "content": "ignored by an image model"},
            {"role": "user", "content": "a red cat on a blue sofa"},
        ],
        modalities=["image"],
        extra_body={"size": "64x64", "seed": 11, **FAST},
    )
    parts = reply.choices[0].message.content
    assert [p["type"] for p in parts] == ["image_url"]
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    chat_image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    direct = client.images.generate(
        prompt="a red cat on a blue sofa", size="64x64", extra_body={"seed": 11, **FAST}
    )
    assert max_pixel_diff(chat_image, _image(direct.data[0])) <= 2


@pytest.mark.parametrize(
    "body, param",
    [
        ({"modalities": ["text"]}, "modalities"),
        ({"stream": True}, "stream"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": " "}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
            "messages.0.content",
        ),
    ],
)
def test_chat_bad_input(server, body, param) -> None:
    request = {"model": "tiny-qwen-image", "messages": [{"role": "user", "content": "x"}], **body}
    r = requests.post(
        f"{server.url}/v1/chat/completions", json=request, headers=server.headers, timeout=30
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def openapi(server) -> dict:
    r = requests.get(f"{server.url}/openapi.json", headers=server.headers, timeout=30)
    assert r.status_code == 200
    return r.json()


def _size_schema(openapi: dict, body: str) -> dict:
    return openapi["components"]["schemas"][body]["properties"]["size"]


def test_edits_on_a_model_that_edits_nothing_name_the_image(server) -> None:
    files = {"image": ("a.png", b"\x89PNG not really", "image/png")}
    r = requests.post(
        f"{server.url}/v1/images/edits",
        data={"prompt": "make it red"},
        files=files,
        headers=server.headers,
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "image", r.text
    assert "/v1/images/generations" in r.json()["error"]["message"]


def test_openapi_states_this_servers_limits(openapi) -> None:
    for body in ("ImageGenerationRequest", "ChatCompletionRequest"):
        size = _size_schema(openapi, body)
        assert size["x-max-pixels"] == MAX_PIXELS and size["x-size-multiple"] == 16
        assert size["anyOf"][0]["pattern"] == r"^[1-9][0-9]{0,5}x[1-9][0-9]{0,5}$"
        properties = openapi["components"]["schemas"][body]["properties"]
        for field in ("n", "num_inference_steps"):
            assert properties[field]["x-max-request-steps"] == MAX_REQUEST_STEPS
        # Qwen-Image has no distilled guidance: the field it refuses is not published
        assert "guidance_scale" not in properties
    edit = openapi["paths"]["/v1/images/edits"]["post"]["requestBody"]["content"]
    edit_size = edit["multipart/form-data"]["schema"]["properties"]["size"]
    assert edit_size["x-max-pixels"] == MAX_PIXELS and edit_size["x-size-multiple"] == 16


def _cheap(openapi: dict, body: str) -> dict:
    """Schema-valid values of the costly fields that keep a fuzz request to a fraction of a
    second: small sizes that obey the published multiple and pixel limit, 1-2 images of 1-2
    steps. Sizes are always sent: the model's default (1024x1024) is slow on this CPU. SLOs are
    generous: this server's admission control answers an unreachable one with 429, which is
    overload, not a bad body (tested on its own below)."""
    size = _size_schema(openapi, body)
    sides = range(size["x-size-multiple"], 64 + 1, size["x-size-multiple"])
    sizes = [f"{w}x{h}" for w in sides for h in sides if w * h <= size["x-max-pixels"]]
    small_int = {"type": "integer", "minimum": 1, "maximum": 2}
    slo = {"type": "number", "minimum": 600_000, "maximum": 10**9}
    return {
        "size": {"enum": sizes},
        "n": small_int,
        "num_inference_steps": small_int,
        "latency_slo_ms": slo,
    }


def _is_png(b64: str) -> bool:
    return base64.b64decode(b64[:12]).startswith(b"\x89PNG")


def _check_images_reply(body: dict, reply: dict) -> None:
    n = body.get("n", 1)
    assert len(reply["data"]) == n and reply["size"] == body["size"]
    assert all(_is_png(item["b64_json"]) for item in reply["data"])
    if body.get("seed") is not None:  # seed, seed + 1, ... wrapping at 2**63
        assert [item["seed"] for item in reply["data"]] == [
            (body["seed"] + i) % 2**63 for i in range(n)
        ]


def _check_chat_reply(body: dict, reply: dict) -> None:
    parts = reply["choices"][0]["message"]["content"]
    assert len(parts) == body.get("n", 1)
    prefix = "data:image/png;base64,"
    assert all(_is_png(p["image_url"]["url"].removeprefix(prefix)) for p in parts)


POSITIVE_EXAMPLES = 20  # each runs the model (text encoder, 1-2 DiT steps, <= 64x64)
NEGATIVE_EXAMPLES = 60  # each is refused in milliseconds
MIN_ACCEPTED = 0.9
"""Schema-valid bodies answered 2xx, at least: the schema states what the server enforces."""


@pytest.mark.parametrize(
    "path, body, check_ok",
    [
        ("/v1/images/generations", "ImageGenerationRequest", _check_images_reply),
        ("/v1/chat/completions", "ChatCompletionRequest", _check_chat_reply),
    ],
    ids=["images", "chat"],
)
def test_fuzz_request_bodies_from_the_published_schema(
    server, openapi, path, body, check_ok
) -> None:
    tally = fuzz_operation(
        server.url,
        server.headers,
        openapi,
        path,
        cheap=_cheap(openapi, body),
        check_ok=check_ok,
        positive_examples=POSITIVE_EXAMPLES,
        negative_examples=NEGATIVE_EXAMPLES,
    )
    print(f"{path}: {tally}")  # -s shows how many ran and why valid ones were refused
    assert tally.valid == POSITIVE_EXAMPLES and tally.invalid == NEGATIVE_EXAMPLES
    assert tally.accepted_fraction >= MIN_ACCEPTED, tally
    assert requests.get(f"{server.url}/health", headers=server.headers).status_code == 200


def test_sigterm_lets_the_request_in_flight_finish(server) -> None:
    """Last in this module: the server stops. With --shutdown-timeout, a request running at
    SIGTERM gets its image, and then the server exits, its stages with it."""
    import psutil

    children = psutil.Process(server.proc.pid).children(recursive=True)
    body = {"prompt": "a slow cat", "size": "512x512", "num_inference_steps": 30}
    reply: dict = {}

    def request() -> None:
        url = f"{server.url}/v1/images/generations"
        reply["response"] = requests.post(url, json=body, headers=server.headers, timeout=120)

    thread = threading.Thread(target=request)
    thread.start()
    deadline = time.monotonic() + 60
    while _metric(server, "vllm_omni:stage_requests_running", stage="dit") < 1:
        assert time.monotonic() < deadline, "the request never reached the DiT stage"
        time.sleep(0.05)
    server.proc.terminate()
    thread.join(timeout=120)
    assert reply["response"].status_code == 200, reply["response"].text
    assert len(reply["response"].json()["data"]) == 1
    assert server.proc.wait(timeout=60) is not None
    assert not [c.pid for c in children if c.is_running() and c.status() != "zombie"]
