# SPDX-License-Identifier: Apache-2.0
"""POST /v1/chat/completions on a model that writes and speaks (the Omni families), in OpenAI's
shapes: the families' API adapter (`add_routes`, with what the family says in `SpeechFamily`).

    client.chat.completions.create(model=M, messages=[...], modalities=["text", "audio"],
                                   audio={"voice": "Chelsie", "format": "wav"})

- `modalities: ["text"]` (the default) returns `message.content`, as any chat model.
- With "audio": `message.audio = {id, data (base64 WAV or raw pcm16), expires_at, transcript}`
  and `content` null, as OpenAI does; the transcript is the thinker's text.
- `stream: true`: server-sent events. Text goes out as it is written (`delta.content`, or
  `delta.audio.transcript` with audio); audio as `delta.audio.data` chunks of pcm16 (the only
  format OpenAI streams); the last audio delta carries `expires_at`; then `finish_reason` and
  `[DONE]`.

Messages are rendered by vLLM's own chat template and multimodal parsing (the thinker stage
does it), so they may carry whatever vLLM's chat API accepts. Errors are HTTP 400 naming the
field; a streamed request whose messages fail to render is refused before the stream starts.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import uuid
import wave
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vllm_omni.audio_file import pcm16, wav_file
from vllm_omni.entrypoints.async_omni_llm import RequestFinished
from vllm_omni.entrypoints.openai.protocol import StrictBody, error_body
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
from vllm_omni.errors import FieldError
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

OPENAI_AUDIO_FORMATS = ("wav", "aac", "mp3", "flac", "opus", "pcm16")
AUDIO_FORMATS = ("wav", "pcm16")  # what this server encodes (no codec libraries needed)
STREAM_CHUNK_S = 0.25  # audio per streamed delta
AUDIO_TTL_S = 24 * 3600  # `expires_at`: how long a client may refer back to the audio by id


class VoiceId(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    voice: str | VoiceId
    # The schema lists what this server encodes; the validator says why OpenAI's others fail.
    format: str = Field(json_schema_extra={"enum": list(AUDIO_FORMATS)})

    @field_validator("format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value not in OPENAI_AUDIO_FORMATS:
            raise ValueError(f"must be one of {list(OPENAI_AUDIO_FORMATS)}")
        if value not in AUDIO_FORMATS:
            raise ValueError(
                f"{value!r} is not supported by this server; use {list(AUDIO_FORMATS)}"
            )
        return value

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice


@dataclass(frozen=True)
class SpeechFamily:
    """What the speech routes need from a model family."""

    seeded_params: Callable[[int, str, list[str]], dict[str, Any]]
    """(seed, voice, the graph's stage names) -> parameters of the stages after the thinker
    for a seeded request that speaks."""
    speech_prompt: Callable[[str, str | None], dict[str, Any]] | None = None
    """(input, instructions) -> the prompt mapping that has the model say `input`
    (/v1/audio/speech; None: the family does not serve it)."""
    speech_params: Callable[[list[str]], dict[str, Any]] | None = None
    """(the graph's stage names) -> the stage parameters of such a request."""


SAMPLING_FIELDS = (
    "temperature", "top_p", "stop", "presence_penalty", "frequency_penalty", "top_k", "min_p",
    "min_tokens", "repetition_penalty", "stop_token_ids", "ignore_eos",
)  # fmt: skip
"""The request fields that go to the thinker's SamplingParams as they are."""


class SpeechChatRequest(StrictBody):
    """OpenAI's chat request, the fields a speaking model uses."""

    int_list_fields = ("stop_token_ids",)

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] = Field(["text"], min_length=1)
    audio: AudioOutput | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    n: Literal[1] = 1
    user: str | None = None
    # vLLM's own sampling extensions to the chat request, with its meanings.
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Token ids that end the reply; each below the model's vocabulary size"
    )
    ignore_eos: bool | None = None

    @model_validator(mode="after")
    def _audio_options(self) -> SpeechChatRequest:
        if "audio" in self.modalities and self.audio is None:
            raise ValueError('audio: required with modalities ["text", "audio"]: {voice, format}')
        if self.audio is not None and "audio" not in self.modalities:
            raise ValueError('modalities: add "audio" to get the audio you asked for')
        if self.stream and self.audio is not None and self.audio.format != "pcm16":
            raise ValueError('audio.format: a streamed reply takes "pcm16"')
        return self

    def omni_prompt(self) -> dict[str, Any]:
        prompt: dict[str, Any] = {
            "messages": self.messages,
            "modalities": list(self.modalities),
            "stream": self.stream,
        }
        if self.audio is not None:
            prompt["voice"] = self.audio.voice_name
        return prompt

    def stage_params(self, stages: list[str], speech: SpeechFamily) -> dict[str, Any]:
        """The thinker takes the request's sampling fields. With a `seed`, the stages after it
        are seeded too (`speech.seeded_params`): same seed, same audio."""
        from vllm import SamplingParams

        kwargs: dict[str, Any] = {
            "max_tokens": self.max_completion_tokens or self.max_tokens,
            "seed": self.seed,
        }
        for name in SAMPLING_FIELDS:
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if self.min_tokens and kwargs["max_tokens"] and self.min_tokens > kwargs["max_tokens"]:
            raise FieldError("min_tokens", f"must be at most max_tokens ({kwargs['max_tokens']})")
        params: dict[str, Any] = {"thinker": SamplingParams(**kwargs)}
        if self.seed is not None and self.audio is not None:
            params.update(speech.seeded_params(self.seed, self.audio.voice_name, stages))
        return params


def audio_chunks(audio: torch.Tensor, sample_rate: int) -> list[bytes]:
    step = max(1, int(STREAM_CHUNK_S * sample_rate))
    return [pcm16(audio[i : i + step]) for i in range(0, len(audio), step)]


def completion(body: SpeechChatRequest, out, model: str) -> dict[str, Any]:
    """A non-streamed reply (out: OmniRequestOutput)."""
    message: dict[str, Any] = {"role": "assistant", "content": out.text}
    if body.audio is not None:
        data = (
            wav_file(out.audio, out.sample_rate) if body.audio.format == "wav" else pcm16(out.audio)
        )
        message["content"] = None
        message["audio"] = {
            "id": f"audio_{uuid.uuid4().hex}",
            "data": base64.b64encode(data).decode(),
            "expires_at": int(time.time()) + AUDIO_TTL_S,
            "transcript": out.text,
        }
    prompt_tokens = len(out.prompt_token_ids or ())
    completion_tokens = len(out.token_ids or ())
    return {
        "id": f"chatcmpl-{out.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": out.finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


async def stream_events(
    body: SpeechChatRequest,
    events: asyncio.Queue,
    first: Any,
    model: str,
    request_id: str,
    on_end: Callable[[str], None] = lambda outcome: None,
) -> AsyncIterator[str]:
    """Server-sent events from the request's StageDelta / RequestFinished items (`first` was
    taken from the queue already, to refuse a request that fails before anything is sent).
    `on_end` hears how the reply ended: "finished" or "failed" (nothing if it was cut off)."""
    created = int(time.time())
    audio_id = f"audio_{uuid.uuid4().hex}"

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        body_ = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        return f"data: {json.dumps(body_)}\n\n"

    speaking = body.audio is not None
    streamed_audio = False
    yield chunk({"role": "assistant", **({"audio": {"id": audio_id}} if speaking else {})})
    event = first
    while True:
        if isinstance(event, Exception):
            error = {"message": str(event), "type": "internal_error", "code": 500}
            yield f"data: {json.dumps({'error': error})}\n\n"
            on_end("failed")
            break
        if isinstance(event, RequestFinished):
            out = event.output
            if speaking and not streamed_audio:  # a stage that decodes whole replies
                for data in audio_chunks(out.audio, out.sample_rate):
                    yield chunk(
                        {"audio": {"id": audio_id, "data": base64.b64encode(data).decode()}}
                    )
            if speaking:
                yield chunk({"audio": {"id": audio_id, "expires_at": created + AUDIO_TTL_S}})
            yield chunk({}, out.finish_reason)
            on_end("finished")
            break
        audio = getattr(event, "data", {}).get("audio")
        if speaking and audio is not None:  # a chunk from a streaming code2wav
            streamed_audio = True
            for data in audio_chunks(audio, event.data["sample_rate"]):
                encoded = base64.b64encode(data).decode()
                yield chunk({"audio": {"id": audio_id, "data": encoded}})
        text = getattr(event, "data", {}).get("text")
        if text:
            yield chunk(
                {"audio": {"id": audio_id, "transcript": text}} if speaking else {"content": text}
            )
        event = await events.get()
    yield "data: [DONE]\n\n"


def audio_samples(data: bytes, fmt: str) -> np.ndarray:
    """Decode what the server sent (for tests and clients): int16 samples."""
    if fmt == "wav":
        with wave.open(io.BytesIO(data)) as f:
            data = f.readframes(f.getnframes())
    return np.frombuffer(data, dtype="<i2")


def start_request(omni, inputs, params, request_id: str) -> tuple[asyncio.Task, asyncio.Queue]:
    """Run a prepared request: its partial outputs (StageDelta), then a RequestFinished or the
    exception it failed with, go to the returned queue."""
    events: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(
        omni.run_prepared(inputs, params, request_id, on_event=events.put_nowait)
    )

    def done(t: asyncio.Task) -> None:
        if not t.cancelled():
            error = t.exception()
            events.put_nowait(error if error is not None else RequestFinished(t.result()))

    task.add_done_callback(done)
    return task, events


def add_routes(app: FastAPI, server: OmniServer, speech: SpeechFamily) -> None:
    """Chat completions for a graph whose outputs are text and audio."""

    @app.post("/v1/chat/completions")
    async def chat(body: SpeechChatRequest, request: Request):
        omni = server.omni
        start = time.monotonic()
        try:
            params = body.stage_params(omni.graph.names, speech)
            inputs, params = omni.prepare(body.omni_prompt(), params)
        except CLIENT_ERRORS as e:  # vLLM's SamplingParams checks raise its own kind
            server.metrics.requests.labels("chat", "rejected").inc()
            return client_error(e)
        request_id = uuid.uuid4().hex
        task, events = start_request(omni, inputs, params, request_id)
        # The first partial output (or the end) decides between a reply and a 400: messages
        # that vLLM cannot render fail here, before any byte is sent.
        first = await next_output(events)
        if is_client_error(first):
            server.metrics.requests.labels("chat", "rejected").inc()
            return client_error(first)
        if isinstance(first, Exception):
            logger.error("chat request failed: %s", first)
            server.metrics.requests.labels("chat", "failed").inc()
            return JSONResponse(error_body(str(first), kind="internal_error", code=500), 500)
        if body.stream:

            async def sse():
                ended: list[str] = []
                try:
                    queue = OutputQueue(events)
                    model = server.model_name
                    async for line in stream_events(
                        body, queue, first, model, request_id, ended.append
                    ):
                        yield line
                finally:
                    task.cancel()
                    outcome = ended[0] if ended else "cancelled"  # the client left mid-stream
                    server.metrics.requests.labels("chat", outcome).inc()
                    server.metrics.latency.labels("chat").observe(time.monotonic() - start)

            return StreamingResponse(sse(), media_type="text/event-stream")
        try:
            while not isinstance(first, RequestFinished | Exception):
                first = await cancel_on_disconnect(request, next_output(events))
        except ClientDisconnected:
            task.cancel()
            server.metrics.requests.labels("chat", "cancelled").inc()
            return Response(status_code=499)
        if is_client_error(first):
            server.metrics.requests.labels("chat", "rejected").inc()
            return client_error(first)
        if isinstance(first, Exception):
            server.metrics.requests.labels("chat", "failed").inc()
            return JSONResponse(error_body(str(first), kind="internal_error", code=500), 500)
        server.metrics.requests.labels("chat", "finished").inc()
        server.metrics.latency.labels("chat").observe(time.monotonic() - start)
        return completion(body, first.output, server.model_name)
