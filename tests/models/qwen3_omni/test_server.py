# SPDX-License-Identifier: Apache-2.0
"""`vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct --omni` (the tiny model under the real name):
chat completions with speech and /v1/audio/speech, through the official openai client against
a live server on loopback."""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest
import requests
import torch

from vllm_omni.audio_file import decode_audio
from vllm_omni.models.omni_speech.chat import audio_samples

from ...helpers.hf_reference import one_thread
from ...helpers.server import BIN, ServerProcess

pytestmark = pytest.mark.engine

MODEL = "Qwen/Qwen3-Omni-30B-A3B-Instruct"
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]
GREEDY = {"temperature": 0, "max_tokens": 24, "seed": 11}  # the seed seeds the talker too
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def server(hub_env):
    command = [
        str(BIN / "vllm"), "serve", MODEL, "--omni", "--enforce-eager",
        "--dtype", "float32", "--max-model-len", "2048",
    ]  # fmt: skip
    with ServerProcess(command, env=hub_env) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


@pytest.fixture(scope="module")
def reference_text(tiny_models):
    """transformers' greedy reply to the chat-templated messages."""
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    folder = tiny_models["qwen3-omni"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    with torch.no_grad(), one_thread():
        out = model.thinker.generate(
            torch.tensor([ids]), max_new_tokens=GREEDY["max_tokens"], do_sample=False
        )
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


def test_text_and_wav(client, reference_text):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "Chelsie", "format": "wav"},
        **GREEDY,
    )
    message = reply.choices[0].message
    assert message.content is None and message.audio.transcript == reference_text
    wav = base64.b64decode(message.audio.data)
    assert wav[:4] == b"RIFF"
    samples = audio_samples(wav, "wav")
    assert len(samples) > 1920 and abs(samples).max() > 0  # at least a frame of 80 ms


def test_streamed_pcm16_begins_before_the_text_ends(client):
    # The talker starts with the thinker: audio deltas come while the transcript is written.
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "pcm16"},
        stream=True,
        temperature=0,
        max_tokens=160,
        extra_body={"min_tokens": 160},
        seed=3,
    )
    order, data, finish = [], b"", None
    for chunk in stream:
        choice = chunk.choices[0]
        audio = choice.delta.audio
        if audio and audio.data:
            order.append("audio")
            data += base64.b64decode(audio.data)
        if audio and audio.transcript:
            order.append("text")
        finish = choice.finish_reason or finish
    assert finish == "length" and len(data) > 0 and len(data) % 2 == 0
    assert "audio" in order[: max(i for i, kind in enumerate(order) if kind == "text")]


def test_unknown_voice_is_400(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            modalities=["text", "audio"],
            audio={"voice": "Nobody", "format": "wav"},
        )
    assert error.value.body["param"] == "voice"


def speak(client, **kwargs) -> bytes:
    # Seeded: the random-weight talker samples its end code at a random frame.
    defaults = dict(model=MODEL, voice="Ethan", input=TEXT, extra_body={"seed": 5})
    return client.audio.speech.create(**{**defaults, **kwargs}).content


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "opus", "aac"])
def test_speech_in_every_format(client, fmt):
    pcm = np.frombuffer(speak(client, response_format="pcm"), dtype="<i2")
    data = speak(client, response_format=fmt)
    assert len(pcm) > 1920  # at least a frame
    if fmt == "wav":  # streamed with a header of unknown length, which `wave` reads to the end
        assert np.array_equal(audio_samples(data, "wav"), pcm)  # the same seed, the same samples
    else:
        samples, rate = decode_audio(data)  # lossy codecs pad and filter; opus decodes at 48 kHz
        assert rate in (24_000, 48_000) and len(samples) > 0 and np.abs(samples).max() > 0


def test_speech_streams_pcm_and_sse(server, client):
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, voice="Aiden", input=TEXT, response_format="pcm", extra_body={"seed": 5}
    ) as response:
        pieces = [piece for piece in response.iter_bytes() if piece]
    assert len(pieces) >= 2 and sum(len(p) for p in pieces) % 2 == 0
    body = {"model": MODEL, "voice": "Ethan", "input": TEXT, "response_format": "pcm", "seed": 5}
    body["stream_format"] = "sse"
    with requests.post(f"{server.url}/v1/audio/speech", json=body, stream=True, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    deltas = [e for e in events[:-1] if e["type"] == "speech.audio.delta"]
    assert deltas and all(base64.b64decode(e["audio"]) for e in deltas)


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"voice": "alloy"}, "voice"),
        ({"speed": 1.5}, "speed"),
        ({"input": "   "}, "input"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "sse", "response_format": "wav"}, "stream_format"),
    ],
)
def test_bad_speech_requests_are_400_naming_the_field(server, extra, field):
    body = {"model": MODEL, "voice": "Ethan", "input": TEXT, **extra}
    response = requests.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field
