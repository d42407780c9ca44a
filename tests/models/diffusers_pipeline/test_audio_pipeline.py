# SPDX-License-Identifier: Apache-2.0
"""A text-to-audio pipeline no family claims, by the hub id users type (the tiny Stable Audio
Open in a hub cache, offline), each request running the pipeline's own call, step-batched:
OmniLLM's clips equal the pipeline's own call for that prompt and seed alone (within 1e-3 of
the clip's peak), with requests of other step counts, lengths, guidance and negative prompts in
flight together, and the requests share denoising steps; `vllm serve` answers
/v1/audio/speech in OpenAI's shape with that clip, and refuses what the model cannot take
naming the field."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import requests
import torch

from vllm_omni import AudioSamplingParams, OmniLLM
from vllm_omni.audio_file import decode_audio
from vllm_omni.errors import FieldError

from ...helpers.hub import offline_hub_at
from ...helpers.server import BIN, ServerProcess

pytestmark = pytest.mark.engine

REPO = "stabilityai/stable-audio-open-1.0"
MAX_RELATIVE_DIFF = 1e-3  # of the clip's peak
PCM16_STEP = 1 / 32767  # a WAV's 16-bit samples


@pytest.fixture(scope="module")
def pipe(tiny_models):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_models["stable-audio"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_clip(pipe, prompt: str, p: AudioSamplingParams) -> np.ndarray:
    """The pipeline's own call for one prompt and seed, with the fields `p` sets."""
    extra = {"audio_end_in_s": p.seconds} if p.seconds is not None else {}
    if p.negative_prompt is not None:
        extra["negative_prompt"] = p.negative_prompt
    if p.guidance_scale is not None:
        extra["guidance_scale"] = p.guidance_scale
    with torch.inference_mode():
        return pipe(
            prompt,
            num_inference_steps=p.num_inference_steps,
            generator=torch.Generator().manual_seed(p.seed),
            output_type="np",
            **extra,
        ).audios[0]


def test_clips_equal_the_pipelines_own_and_share_steps(hub_cache, pipe):
    prompts = ["a dog barking", "rain on a roof", "a piano chord"]
    params = [
        AudioSamplingParams(num_inference_steps=3, seed=0),  # the longest clip, guided
        AudioSamplingParams(num_inference_steps=2, seed=1, seconds=0.5, guidance_scale=1.0),
        AudioSamplingParams(num_inference_steps=4, seed=2, negative_prompt="noise"),
    ]
    with offline_hub_at(hub_cache), OmniLLM(REPO) as omni:
        outputs = omni.generate(prompts, params, use_tqdm=False)
        engine_steps = omni.get_stage_stats()["pipeline"]["num_steps"]
        with pytest.raises(FieldError, match=r"seconds: StableAudioPipeline makes clips of at "):
            omni.generate(["a cat"], AudioSamplingParams(seconds=60, num_inference_steps=1))
    for prompt, p, out in zip(prompts, params, outputs):
        theirs = pipeline_clip(pipe, prompt, p)
        assert out.sample_rate == 44100 and out.audio.shape == theirs.shape  # stereo
        diff = np.abs(np.asarray(out.audio) - theirs).max() / np.abs(theirs).max()
        assert diff <= MAX_RELATIVE_DIFF, (prompt, diff)
    assert outputs[1].audio.shape[-1] == 44100 // 2
    assert engine_steps < sum(p.num_inference_steps for p in params)  # 9 one after another


def test_serve_answers_the_speech_route(hub_env, pipe):
    with ServerProcess([str(BIN / "vllm"), "serve", REPO, "--omni"], env=hub_env) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        reply = client.audio.speech.with_raw_response.create(
            model=REPO,
            input="a dog barking",
            voice=openai.omit,
            response_format="wav",
            extra_body={"seconds": 1.0, "num_inference_steps": 3, "seed": 5},
        )
        seed = int(reply.headers["x-seed"])
        clip, rate = decode_audio(reply.content)
        refused = {
            field: requests.post(
                f"{server.url}/v1/audio/speech", json={"input": "a cat", field: value}, timeout=30
            )
            for field, value in (("seconds", 60.0), ("cache_threshold", 0.1), ("speed", 2.0))
        }
    assert rate == 44100 and seed == 5
    theirs = pipeline_clip(pipe, "a dog barking", AudioSamplingParams(1.0, 3, seed=5))
    assert clip.shape == theirs.shape == (2, 44100)
    assert np.abs(clip - np.clip(theirs, -1, 1)).max() <= MAX_RELATIVE_DIFF + PCM16_STEP
    for field, response in refused.items():
        assert response.status_code == 400, (field, response.text)
        assert response.json()["error"]["param"] == field
