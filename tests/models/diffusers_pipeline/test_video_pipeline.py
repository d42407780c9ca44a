# SPDX-License-Identifier: Apache-2.0
"""A text-to-video pipeline no family claims, by the hub ids users type (the tiny CogVideoX-2b in
a hub cache, offline), each request running the pipeline's own call, step-batched: OmniLLM's
frames equal the pipeline's own call for that prompt and seed alone, with requests of other step
counts, seeds, guidance, negative prompts and shapes in flight together, and the requests share
denoising steps; `vllm serve` runs it as /v1/videos jobs whose MP4 holds those frames, kept in
`--video-dir` for a server started again on it; a frame count the VAE cannot make is refused
naming the field."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import requests

from vllm_omni import OmniLLM
from vllm_omni.diffusion.video_params import VideoSamplingParams
from vllm_omni.errors import FieldError
from vllm_omni.video_file import decode_mp4, encode_mp4

from ...helpers.diffusers_reference import max_pixel_diff, pipeline_video
from ...helpers.hub import offline_hub_at
from ...helpers.server import BIN, ServerProcess

pytestmark = pytest.mark.engine

REPO = "zai-org/CogVideoX-2b"
MAX_PIXEL_DIFF = 2  # of 255
MAX_MEAN_DIFF = 1.0  # of 255: against the pipeline's frames through the same MP4 encoder


@pytest.fixture(scope="module")
def omni(hub_cache):
    with offline_hub_at(hub_cache), OmniLLM(REPO) as omni:
        yield omni


def test_videos_equal_the_pipelines_own_and_share_steps(omni, tiny_models):
    prompts = ["a red cat", "a boat at dusk", "a tree"]
    params = [
        VideoSamplingParams(num_inference_steps=3, seed=0),  # the default 9 frames of 64 x 64
        VideoSamplingParams(num_inference_steps=2, seed=1, negative_prompt="blurry"),
        VideoSamplingParams(
            num_frames=17, height=48, width=80, num_inference_steps=3, seed=2, guidance_scale=1.0
        ),
    ]
    before = omni.get_stage_stats()["pipeline"]["num_steps"]
    outputs = omni.generate(prompts, params, use_tqdm=False)
    engine_steps = omni.get_stage_stats()["pipeline"]["num_steps"] - before
    for prompt, p, out in zip(prompts, params, outputs):
        frames, height, width = (p.num_frames or 9), (p.height or 64), (p.width or 64)
        assert out.video.shape == (frames, height, width, 3)
        filled = VideoSamplingParams(
            **{**vars(p), "num_frames": frames, "height": height, "width": width}
        )
        theirs = pipeline_video(tiny_models["cogvideox"], prompt, filled)
        assert max_pixel_diff(out.video, theirs) <= MAX_PIXEL_DIFF, prompt
        assert out.fps == 16.0
    # 3 + 2 steps of one shape together, the other shape beside them: 6 in all, not 8.
    assert engine_steps < sum(p.num_inference_steps for p in params)


def test_frame_counts_the_vae_cannot_make_are_refused(omni):
    # CogVideoX's VAE makes 4k + 1 frames only from an odd number of latent frames.
    with pytest.raises(FieldError, match=r"num_frames: must be 8k \+ 1 \(1, 9, 17, 25, \.\.\.\)"):
        omni.generate(["a cat"], VideoSamplingParams(num_frames=13, num_inference_steps=1))
    with pytest.raises(FieldError, match="cache_threshold: a pipeline run by its own call"):
        omni.generate(["a cat"], VideoSamplingParams(num_inference_steps=1, cache_threshold=0.1))


def test_serve_makes_video_jobs_that_outlive_the_server(hub_env, tiny_models, tmp_path):
    # The release's old id; the videos and the jobs' records in a folder of the user's.
    command = [str(BIN / "vllm"), "serve", "THUDM/CogVideoX-2b", "--omni"]
    command += ["--video-dir", str(tmp_path / "videos")]
    with ServerProcess(command, env=hub_env) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        video = client.videos.create_and_poll(
            prompt="a red cat",
            size="64x64",
            seconds="1",  # 16 frames a second, rounded to the 8k + 1 the VAE makes: 17
            extra_body={"num_inference_steps": 2, "seed": 3},
            poll_interval_ms=50,
        )
        assert video.status == "completed", video
        mp4 = client.videos.download_content(video.id).read()
        bad = requests.post(
            f"{server.url}/v1/videos",
            data={"prompt": "a cat", "num_frames": "13", "size": "64x64"},
            timeout=30,
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "num_frames", bad.text
    frames, fps = decode_mp4(mp4)
    assert frames.shape == (17, 64, 64, 3) and fps == 16.0
    p = VideoSamplingParams(num_frames=17, height=64, width=64, num_inference_steps=2, seed=3)
    theirs = decode_mp4(encode_mp4(pipeline_video(tiny_models["cogvideox"], "a red cat", p), 16.0))
    assert np.abs(frames.astype(int) - theirs[0].astype(int)).mean() <= MAX_MEAN_DIFF
    # Started again on the folder, a server lists the job and serves its video.
    with ServerProcess(command, env=hub_env) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        assert [v.id for v in client.videos.list()] == [video.id]
        assert client.videos.retrieve(video.id).status == "completed"
        assert client.videos.download_content(video.id).read() == mp4
