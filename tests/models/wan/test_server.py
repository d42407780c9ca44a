# SPDX-License-Identifier: Apache-2.0
"""`vllm serve Wan-AI/Wan2.1-T2V-1.3B-Diffusers --omni` (the tiny pipeline under the real name):
the /v1/videos job API through the official client and plain HTTP - a job completes and its MP4
decodes to the frames asked for, as diffusers' own frames encoded the same way (H.264 in yuv420p
is lossy: it halves the colour resolution, which the random-weight models' noise-like frames
feel most: 13/255 on average even at x264's lossless setting); jobs outlive their
connection, report progress, can be listed and deleted (which frees the DiT stage's state); bad
forms get a 400 naming the field, a full queue a 429; image-to-video takes `input_reference`."""

from __future__ import annotations

import io
import re
import time

import numpy as np
import openai
import pytest
import requests
from PIL import Image

from vllm_omni.diffusion.video_params import VideoSamplingParams
from vllm_omni.video_file import decode_mp4, encode_mp4

from ...helpers.diffusers_reference import pipeline_video
from ...helpers.server import BIN, ServerProcess
from .test_wan import picture

pytestmark = pytest.mark.engine

T2V = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
I2V = "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers"
MAX_PIXELS = 128 * 128
MAX_JOBS = 3
MAX_MEAN_DIFF = 1.0  # of 255: against diffusers' frames through the same encoder


def serve(model: str, hub_env, *extra: str) -> ServerProcess:
    command = [str(BIN / "vllm"), "serve", model, "--omni", "--max-image-pixels", str(MAX_PIXELS)]
    command += ["--max-video-jobs", str(MAX_JOBS), "--max-request-steps", "1000", *extra]
    return ServerProcess(command, env=hub_env)


@pytest.fixture(scope="module")
def server(hub_env):
    with serve(T2V, hub_env) as server:
        yield server


def as_served(frames: np.ndarray) -> np.ndarray:
    """Frames as they come back from an MP4 the server would write of them."""
    return decode_mp4(encode_mp4(frames, 16.0))[0].astype(int)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def create(server, files=None, **fields) -> requests.Response:
    data = {"prompt": "a red cat", "size": "64x64", "num_frames": "9", **fields}
    data["num_inference_steps"] = data.get("num_inference_steps", "3")
    return requests.post(f"{server.url}/v1/videos", data=data, files=files or [], timeout=60)


def wait(server, video_id: str, until=lambda job: job["status"] in ("completed", "failed")):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = requests.get(f"{server.url}/v1/videos/{video_id}", timeout=10).json()
        if until(job):
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {video_id} did not get there: {job}")


def dit_state(server) -> dict[str, float]:
    """The DiT stage's live requests and cache entries, as /metrics reports them."""
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    found = {}
    for name in ("stage_requests_running", "stage_requests_waiting", "dit_cache_entries"):
        match = re.search(rf'^vllm_omni:{name}\{{stage="dit"\}} (\S+)$', text, re.M)
        found[name] = float(match.group(1))
    return found


def test_openai_client_video_job_completes(server, tiny_models):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    video = client.videos.create(
        model=T2V,
        prompt="a red cat on the street",
        size="64x48",  # type: ignore[arg-type]  (the client lists Sora's sizes)
        seconds="1",  # type: ignore[arg-type]  -> 16 frames at 16 fps, rounded to 4k + 1: 17
        extra_body={"seed": 7, "num_inference_steps": 3},
    )
    assert video.status in ("queued", "in_progress") and video.size == "64x48"
    assert video.seconds == "1" and video.model == T2V
    job = wait(server, video.id)
    assert job["status"] == "completed" and job["progress"] == 100, job
    assert job["expires_at"] > job["completed_at"] >= job["created_at"]
    data = client.videos.download_content(video.id).read()
    frames, fps = decode_mp4(data)
    assert frames.shape == (17, 48, 64, 3) and fps == 16.0
    params = VideoSamplingParams(height=48, width=64, num_frames=17, num_inference_steps=3, seed=7)
    expected = pipeline_video(tiny_models["wan2.1-t2v"], "a red cat on the street", params)
    assert np.abs(frames.astype(int) - as_served(expected)).mean() <= MAX_MEAN_DIFF
    assert client.videos.retrieve(video.id).status == "completed"


def test_openai_client_create_and_poll_list_delete(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    video = client.videos.create_and_poll(
        prompt="a cat",
        size="32x32",  # type: ignore[arg-type]
        extra_body={"num_frames": 5, "num_inference_steps": 2},
    )
    assert video.status == "completed" and video.progress == 100
    assert video.id in [v.id for v in client.videos.list(limit=100)]
    assert client.videos.delete(video.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_progress_and_listing(server):
    first = create(server).json()
    long = create(server, num_inference_steps="200").json()
    assert "id" in long, long
    seen = wait(server, long["id"], until=lambda job: 0 < job["progress"] < 100)
    assert seen["status"] == "in_progress"
    wait(server, long["id"])
    listing = requests.get(f"{server.url}/v1/videos", params={"limit": 1}, timeout=10).json()
    assert [v["id"] for v in listing["data"]] == [long["id"]] and listing["has_more"]
    after = requests.get(
        f"{server.url}/v1/videos", params={"after": long["id"], "limit": 1}, timeout=10
    ).json()
    assert [v["id"] for v in after["data"]] == [first["id"]]
    oldest = requests.get(f"{server.url}/v1/videos", params={"order": "asc"}, timeout=10).json()
    ids = [v["id"] for v in oldest["data"]]
    assert ids.index(first["id"]) < ids.index(long["id"])


def test_delete_cancels_a_running_job_and_frees_its_dit_state(server):
    job = create(server, num_inference_steps="1000").json()
    wait(server, job["id"], until=lambda j: j["progress"] > 0)
    assert dit_state(server)["dit_cache_entries"] >= 1
    running = requests.get(f"{server.url}/v1/videos/{job['id']}", timeout=10)
    assert running.headers["openai-poll-after-ms"] == "200"  # the client's polling interval
    content = requests.get(f"{server.url}/v1/videos/{job['id']}/content", timeout=10)
    assert content.status_code == 409 and "in_progress" in content.json()["error"]["message"]
    deleted = requests.delete(f"{server.url}/v1/videos/{job['id']}", timeout=30)
    assert deleted.json() == {"id": job["id"], "object": "video.deleted", "deleted": True}
    deadline = time.monotonic() + 30
    while any(dit_state(server).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert dit_state(server) == {
        "stage_requests_running": 0,
        "stage_requests_waiting": 0,
        "dit_cache_entries": 0,
    }
    for url in (f"/v1/videos/{job['id']}", f"/v1/videos/{job['id']}/content"):
        assert requests.get(f"{server.url}{url}", timeout=10).status_code == 404
    assert requests.delete(f"{server.url}/v1/videos/{job['id']}", timeout=10).status_code == 404


def test_unknown_video_is_404(server):
    reply = requests.get(f"{server.url}/v1/videos/video_nope", timeout=10)
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "video_id"
    listing = requests.get(f"{server.url}/v1/videos", params={"after": "video_nope"}, timeout=10)
    assert listing.status_code == 404 and listing.json()["error"]["param"] == "after"


def test_a_full_queue_is_429_and_other_jobs_go_on(server):
    jobs = [create(server, num_inference_steps="1000").json() for _ in range(MAX_JOBS)]
    refused = create(server)
    assert refused.status_code == 429, refused.text
    assert "--max-video-jobs" in refused.json()["error"]["message"]
    for job in jobs:
        requests.delete(f"{server.url}/v1/videos/{job['id']}", timeout=30)
    done = wait(server, create(server).json()["id"])
    assert done["status"] == "completed"


@pytest.mark.parametrize(
    "fields, files, param",
    [
        ({"num_frames": "10"}, None, "num_frames"),
        ({"num_frames": "401"}, None, "num_frames"),
        ({"size": "72x64"}, None, "size"),
        ({"size": "256x256"}, None, "size"),
        ({"seconds": "0"}, None, "seconds"),
        ({"prompt": " "}, None, "prompt"),
        ({"guidance_scale_2": "2"}, None, "guidance_scale_2"),
        ({"frames": "9"}, None, "frames"),
        ({}, [("input_reference", ("a.png", png(picture(0)), "image/png"))], "input_reference"),
    ],
)
def test_bad_forms_name_the_field(server, fields, files, param):
    reply = create(server, files=files, **fields)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.json()


def test_a_json_body_is_refused_naming_the_form(server):
    reply = requests.post(f"{server.url}/v1/videos", json={"prompt": "a cat"}, timeout=10)
    assert reply.status_code == 400 and "multipart/form-data" in reply.json()["error"]["message"]


def test_the_schema_states_the_limits(server):
    schema = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    form = schema["paths"]["/v1/videos"]["post"]["requestBody"]["content"]
    properties = form["multipart/form-data"]["schema"]["properties"]
    size = next(b for b in properties["size"]["anyOf"] if b["type"] == "string")
    assert size["x-max-pixels"] == MAX_PIXELS and size["x-size-multiple"] == 16
    frames = next(b for b in properties["num_frames"]["anyOf"] if b["type"] == "integer")
    assert frames["maximum"] == 161 and frames["x-frame-step"] == 4
    assert "input_reference" not in properties  # text-to-video
    assert "guidance_scale_2" not in properties  # one expert


def test_fuzz_video_forms_from_the_published_schema(server):
    """Forms generated from the published schema: valid ones make jobs (each deleted at once),
    invalid ones get a 400 naming a field they violate; never a 5xx."""
    from ...helpers.openapi_fuzz import fuzz_form_operation

    openapi = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    small = {"type": "integer", "minimum": 1, "maximum": 2}
    cheap = {
        "size": {"enum": ["16x16", "32x16", "16x32", "32x32"]},
        "num_frames": {"enum": [1, 5, 9]},
        "num_inference_steps": small,
        "latency_slo_ms": {"type": "number", "minimum": 600_000, "maximum": 10**9},
    }

    def check_ok(body: dict, reply: dict) -> None:
        assert reply["object"] == "video" and reply["size"] == body["size"]
        requests.delete(f"{server.url}/v1/videos/{reply['id']}", timeout=30)

    tally = fuzz_form_operation(
        server.url,
        {},
        openapi,
        "/v1/videos",
        files={},
        cheap=cheap,
        check_ok=check_ok,
        positive_examples=10,
        negative_examples=40,
    )
    print(tally)
    assert tally.valid == 10 and tally.invalid == 40
    assert tally.accepted_fraction >= 0.9, tally
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200


def test_image_to_video_takes_the_first_frame(hub_env, tiny_models):
    with serve(I2V, hub_env) as server:
        image = picture(1)
        reply = create(
            server,
            files=[("input_reference", ("frame.png", png(image), "image/png"))],
            seed="3",
        )
        assert reply.status_code == 200, reply.text
        job = wait(server, reply.json()["id"])
        assert job["status"] == "completed", job
        data = requests.get(f"{server.url}/v1/videos/{job['id']}/content", timeout=30)
        assert data.headers["content-type"] == "video/mp4"
        frames, _ = decode_mp4(data.content)
        params = VideoSamplingParams(
            height=64, width=64, num_frames=9, num_inference_steps=3, seed=3
        )
        expected = pipeline_video(tiny_models["wan2.1-i2v"], "a red cat", params, image=image)
        assert np.abs(frames.astype(int) - as_served(expected)).mean() <= MAX_MEAN_DIFF
        for files, message in [
            (None, "give the first frame"),
            ([("input_reference", ("notes.txt", b"not an image", "text/plain"))], "not an image"),
        ]:
            bad = create(server, files=files)
            assert bad.status_code == 400, bad.text
            assert bad.json()["error"]["param"] == "input_reference"
            assert message in bad.json()["error"]["message"]
