# SPDX-License-Identifier: Apache-2.0
"""The route of a graph whose output is audio made from a prompt (sound, music):
POST /v1/audio/speech in OpenAI's shape - `input` is the prompt, the reply the audio file in
`response_format` - with the project's extensions (`seconds`, `num_inference_steps`,
`guidance_scale`, `negative_prompt`, `seed`, `latency_slo_ms`; openai client: `extra_body`). The
fields that pick or shape a speaker are not in its schema (a body that sets one gets a 400 naming
it), `speed` takes only 1 and `stream_format` only "audio": the clip is made whole from the
prompt. The clip's seed comes back in `x-seed`."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import Field, field_validator

from vllm_omni.audio_file import MEDIA_TYPES, encode_audio
from vllm_omni.diffusion.audio_params import AudioSamplingParams
from vllm_omni.entrypoints.openai.protocol import MAX_SEED, StrictBody, non_blank
from vllm_omni.entrypoints.openai.request_runs import run_requests
from vllm_omni.entrypoints.openai.server_utils import OmniServer, client_error

SAMPLING_FIELDS = (
    "seconds",
    "num_inference_steps",
    "guidance_scale",
    "negative_prompt",
    "seed",
    "latency_slo_ms",
)
"""The body's fields that become the clip's AudioSamplingParams."""


class SoundRequest(StrictBody):
    """OpenAI's speech request, for a model that makes audio from a prompt."""

    model: str | None = None
    input: str = Field(min_length=1, max_length=4096, description="What the clip sounds like.")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, allow_inf_nan=False)
    stream_format: Literal["audio"] = "audio"
    seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="The clip's length (default: the model's)."
    )
    num_inference_steps: int | None = Field(None, ge=1, le=1000)
    guidance_scale: float | None = Field(None, ge=0, allow_inf_nan=False)
    negative_prompt: str | None = Field(None, max_length=4096)
    seed: int | None = Field(None, ge=0, lt=MAX_SEED)
    latency_slo_ms: float | None = Field(None, gt=0, allow_inf_nan=False)

    _input = field_validator("input")(non_blank)

    @field_validator("speed")
    @classmethod
    def _speed(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError("only 1.0 is supported: set the clip's length with `seconds`")
        return value

    def sampling_params(self) -> AudioSamplingParams:
        values: dict[str, Any] = {
            name: getattr(self, name) for name in SAMPLING_FIELDS if getattr(self, name) is not None
        }
        return AudioSamplingParams(**values)


def add_routes(app: FastAPI, server: OmniServer) -> None:
    @app.post("/v1/audio/speech")
    async def speech(body: SoundRequest, request: Request):
        start = time.monotonic()
        try:
            params = body.sampling_params()
        except ValueError as e:
            server.metrics.requests.labels("speech", "rejected").inc()
            return client_error(e)
        prompt = {"prompt": body.input}
        outputs, error = await run_requests(server, "speech", request, prompt, [params])
        if error is not None:
            return error
        (out,) = outputs
        # Off the event loop: a long clip's mp3 or aac takes a while to encode.
        data = await asyncio.to_thread(
            encode_audio, out.audio, out.sample_rate, body.response_format
        )
        server.metrics.requests.labels("speech", "finished").inc()
        server.metrics.latency.labels("speech").observe(time.monotonic() - start)
        headers = {"x-seed": str(out.seed)}
        return Response(data, media_type=MEDIA_TYPES[body.response_format], headers=headers)
