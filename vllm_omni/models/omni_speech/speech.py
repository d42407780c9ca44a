# SPDX-License-Identifier: Apache-2.0
"""POST /v1/audio/speech on a model that speaks (the Omni families), in OpenAI's shape.

    client.audio.speech.create(model=M, voice="Ethan", input="Hello there.", response_format="wav")

An Omni model speaks what its thinker writes, so the family builds a prompt whose assistant
turn already holds `input` (`SpeechFamily.speech_prompt`): the thinker reads it in one pass,
writes one token that is not spoken, and the talker speaks `input`. `instructions` become the
user turn the talker reads (default: `input` itself).

- `response_format`: `mp3` (OpenAI's default), `opus`, `aac`, `flac`, `wav`, `pcm` (16-bit
  little-endian samples at the model's rate, 24 kHz), encoded by `vllm_omni.audio_file`.
- `stream_format`: `audio` (default) sends the file; `wav` and `pcm` go out as the audio is
  decoded (a WAV header of unknown length first). `sse` sends `speech.audio.delta` events of
  base64 `pcm`, then `speech.audio.done`.
- `speed` other than 1.0 is refused: the models speak at one pace.
- `seed` (an extension): seeds the talker's sampling (and Qwen2.5-Omni's code2wav noise); same
  seed, same audio.

Errors are HTTP 400 naming the field.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field, ValidationInfo, field_validator

from vllm_omni.audio_file import MEDIA_TYPES, encode_audio, pcm16, wav_header
from vllm_omni.entrypoints.async_omni_llm import RequestFinished
from vllm_omni.entrypoints.openai.protocol import StrictBody, error_body, non_blank
from vllm_omni.entrypoints.openai.server_utils import (
    CLIENT_ERRORS,
    ClientDisconnected,
    OmniServer,
    OutputQueue,
    cancel_on_disconnect,
    client_error,
    is_client_error,
    next_output,
)
from vllm_omni.models.omni_speech.chat import SpeechFamily, VoiceId, start_request

STREAMED_FORMATS = ("wav", "pcm")


def chatml_speech_prompt(text: str, instructions: str | None) -> dict[str, Any]:
    """A ChatML prompt (the Qwen Omni models') whose assistant turn already holds `text`; the
    user turn is `instructions`, or the text itself."""
    user = instructions or text
    return {"prompt": f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{text}"}


def speak_given_text(stages: list[str]) -> dict[str, Any]:
    """The thinker's parameters of a speech request: it reads the prompt in one pass and writes
    one token, which is not spoken (a thinker never hands on its last token's row)."""
    from vllm import SamplingParams

    return {"thinker": SamplingParams(temperature=0, max_tokens=1)}


class SpeechRequest(StrictBody):
    """OpenAI's speech request."""

    model: str | None = None
    input: str = Field(min_length=1, max_length=4096)
    voice: str | VoiceId
    instructions: str | None = Field(None, max_length=4096)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, allow_inf_nan=False)
    stream_format: Literal["audio", "sse"] = "audio"
    # An extension, as vLLM's chat has one (openai client: `extra_body`).
    seed: int | None = Field(None, ge=0, lt=2**63)

    _input = field_validator("input")(non_blank)

    @field_validator("speed")
    @classmethod
    def _speed(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError("only 1.0 is supported: the model speaks at one pace")
        return value

    @field_validator("stream_format")
    @classmethod
    def _sse(cls, value: str, info: ValidationInfo) -> str:
        if value == "sse" and info.data.get("response_format") != "pcm":
            raise ValueError('"sse" sends "pcm" samples: ask for response_format "pcm"')
        return value

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice

    @property
    def streams(self) -> bool:
        return self.stream_format == "sse" or self.response_format in STREAMED_FORMATS


def add_routes(app: FastAPI, server: OmniServer, speech: SpeechFamily) -> None:
    """/v1/audio/speech, for a family with a `speech_prompt`."""
    assert speech.speech_prompt is not None and speech.speech_params is not None

    @app.post("/v1/audio/speech")
    async def create_speech(body: SpeechRequest, request: Request):
        omni = server.omni
        start = time.monotonic()
        prompt = {
            **speech.speech_prompt(body.input, body.instructions),
            "modalities": ["audio"],
            "voice": body.voice_name,
            "stream": body.streams,
        }
        try:
            params = speech.speech_params(omni.graph.names)
            if body.seed is not None:
                params.update(speech.seeded_params(body.seed, body.voice_name, omni.graph.names))
            inputs, params = omni.prepare(prompt, params)
        except CLIENT_ERRORS as e:
            server.metrics.requests.labels("speech", "rejected").inc()
            return client_error(e)
        task, events = start_request(omni, inputs, params, uuid.uuid4().hex)
        first = await next_output(events)
        if is_client_error(first):
            server.metrics.requests.labels("speech", "rejected").inc()
            return client_error(first)

        def finished(outcome: str) -> None:
            server.metrics.requests.labels("speech", outcome).inc()
            server.metrics.latency.labels("speech").observe(time.monotonic() - start)

        if body.streams and not isinstance(first, Exception):
            lines = _sse(first, OutputQueue(events)) if body.stream_format == "sse" else None
            chunks = lines or _audio_chunks(body.response_format, first, OutputQueue(events))

            async def stream():
                ended = "cancelled"  # the client left mid-stream
                try:
                    async for piece in chunks:
                        yield piece
                    ended = "finished"
                finally:
                    task.cancel()
                    finished(ended)

            media = "text/event-stream" if lines else MEDIA_TYPES[body.response_format]
            return StreamingResponse(stream(), media_type=media)
        try:
            while not isinstance(first, RequestFinished | Exception):
                first = await cancel_on_disconnect(request, next_output(events))
        except ClientDisconnected:
            task.cancel()
            finished("cancelled")
            return Response(status_code=499)
        if is_client_error(first):
            return client_error(first)
        if isinstance(first, Exception):
            finished("failed")
            return JSONResponse(error_body(str(first), kind="internal_error", code=500), 500)
        out = first.output
        data = await asyncio.to_thread(
            encode_audio, out.audio, out.sample_rate, body.response_format
        )
        finished("finished")
        return Response(data, media_type=MEDIA_TYPES[body.response_format])


async def _audio_pieces(first: Any, events: OutputQueue):
    """(samples, sample_rate) of the request's audio as code2wav decodes it; an error ends it."""
    event, streamed = first, False
    while True:
        if isinstance(event, Exception):
            raise event
        if isinstance(event, RequestFinished):
            if not streamed and event.output.audio is not None:  # a stage that decodes whole
                yield event.output.audio, event.output.sample_rate
            return
        audio = getattr(event, "data", {}).get("audio")
        if audio is not None and len(audio):
            streamed = True
            yield audio, event.data["sample_rate"]
        event = await events.get()


async def _audio_chunks(fmt: str, first: Any, events: OutputQueue):
    header = fmt != "wav"
    async for audio, rate in _audio_pieces(first, events):
        if not header:
            header = True
            yield wav_header(rate)
        yield pcm16(audio)


async def _sse(first: Any, events: OutputQueue):
    def event(body: dict[str, Any]) -> str:
        return f"data: {json.dumps(body)}\n\n"

    try:
        async for audio, _ in _audio_pieces(first, events):
            data = base64.b64encode(pcm16(audio)).decode()
            yield event({"type": "speech.audio.delta", "audio": data})
    except Exception as e:  # noqa: BLE001 - the stream has started: the error goes in it
        yield event({"type": "error", "error": {"message": str(e), "type": "internal_error"}})
        return
    yield event({"type": "speech.audio.done"})
