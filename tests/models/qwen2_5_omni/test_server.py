# SPDX-License-Identifier: Apache-2.0
"""`vllm serve <Qwen2.5-Omni folder> --omni`: chat completions with text and speech, through the
official openai client against a live server on loopback."""

from __future__ import annotations

import base64
import time

import openai
import pytest
import requests
import torch

from vllm_omni.models.omni_speech.chat import audio_samples

from ...helpers.hf_reference import one_thread
from ...helpers.media import audio_part, image_part
from ...helpers.openapi_fuzz import fuzz_operation
from ...helpers.server import BIN, ServerProcess

pytestmark = pytest.mark.engine

MODEL = "Qwen/Qwen2.5-Omni-7B"  # the tiny model, stored under the real name (hub_cache)
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]
SAMPLES_PER_CODE = 480
GREEDY = {"temperature": 0, "max_tokens": 24, "seed": 11}


@pytest.fixture(scope="module")
def server(hub_env):
    """Served by the name a user types, found in a Hugging Face cache offline; the served
    model name is that name, as in vLLM."""
    command = [
        str(BIN / "vllm"),
        "serve",
        MODEL,
        "--omni",
        "--enforce-eager",  # compiled: `make demo` (CI runs it before the tests)
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
    ]
    with ServerProcess(command, env=hub_env) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


@pytest.fixture(scope="module")
def reference_text(tiny_models):
    """transformers' greedy reply to the chat-templated messages."""
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    folder = tiny_models["qwen2.5-omni"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    with torch.no_grad(), one_thread():
        out = model.thinker.generate(
            torch.tensor([ids]), max_new_tokens=GREEDY["max_tokens"], do_sample=False
        )
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


def test_text_reply(client, reference_text):
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    message = reply.choices[0].message
    assert message.content == reference_text
    assert message.audio is None
    assert 0 < reply.usage.completion_tokens <= GREEDY["max_tokens"]


def test_text_and_wav(client, reference_text):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "wav"},
        **GREEDY,
    )
    message = reply.choices[0].message
    assert message.content is None
    assert message.audio.transcript == reference_text
    assert message.audio.id and message.audio.expires_at > reply.created
    wav = base64.b64decode(message.audio.data)
    assert wav[:4] == b"RIFF"
    samples = audio_samples(wav, "wav")
    assert len(samples) > 0 and len(samples) % SAMPLES_PER_CODE == 0
    assert abs(samples).max() > 0


def test_image_and_audio_parts(client, tiny_models):
    # Parsed and rendered by vLLM's chat API in the thinker stage: the prompt holds as many tokens
    # as transformers' processor gives the same message (the 4x8-patch image's 8, the audio's).
    from transformers import AutoProcessor

    gen = torch.Generator().manual_seed(2)
    image, picture = image_part(gen)
    samples, clip = audio_part(gen)
    question = {"type": "text", "text": "What do you see and hear?"}
    content = [picture, clip]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content + [question]}],
        modalities=["text", "audio"],
        audio={"voice": "Chelsie", "format": "wav"},
        **GREEDY,
    )
    message = reply.choices[0].message
    assert message.audio.transcript
    assert len(audio_samples(base64.b64decode(message.audio.data), "wav")) > 0
    processor = AutoProcessor.from_pretrained(tiny_models["qwen2.5-omni"])
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "audio"}, question]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[image], audio=[samples], return_tensors="pt")
    assert reply.usage.prompt_tokens == inputs["input_ids"].shape[1]


def test_streamed_pcm16(client, reference_text):
    kwargs = dict(model=MODEL, messages=MESSAGES, modalities=["text", "audio"], **GREEDY)
    whole = client.chat.completions.create(audio={"voice": "Chelsie", "format": "pcm16"}, **kwargs)
    stream = client.chat.completions.create(
        audio={"voice": "Chelsie", "format": "pcm16"}, stream=True, **kwargs
    )
    transcript, data, finish, expires = "", b"", None, None
    for chunk in stream:
        choice = chunk.choices[0]
        audio = choice.delta.audio  # openai's ChoiceDeltaAudio
        if audio:
            transcript += audio.transcript or ""
            data += base64.b64decode(audio.data or "")
            expires = audio.expires_at or expires
        finish = choice.finish_reason or finish
    assert transcript == reference_text == whole.choices[0].message.audio.transcript
    # The streamed talker samples in segments that follow the thinker's pace, so its codes
    # (and the audio) differ from the whole reply's; greedy codes are equal (test_omni_llm.py).
    assert len(data) > 0 and len(data) % (2 * SAMPLES_PER_CODE) == 0 and expires is not None
    assert finish in ("stop", "length")


def test_same_seed_same_audio(client):
    def wav():
        reply = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            modalities=["text", "audio"],
            audio={"voice": "Chelsie", "format": "pcm16"},
            **GREEDY,
        )
        return reply.choices[0].message.audio.data

    assert wav() == wav()


def test_streamed_text(client, reference_text):
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **GREEDY)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == reference_text


def _chat_requests(server, status: str) -> float:
    """The server's count of chat requests that ended with `status`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{server.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {"endpoint": "chat", "status": status}
            if sample.name == "vllm_omni:requests_total" and sample.labels == labels:
                return sample.value
    return 0.0


def test_streamed_reply_is_counted_by_how_it_ended(server):
    """A stream read to its end counts as finished; one the client drops, as cancelled."""
    url = f"{server.url}/v1/chat/completions"
    speech = {"modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"}}
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "max_tokens": 64, **speech}
    before = {s: _chat_requests(server, s) for s in ("finished", "cancelled")}
    with requests.post(url, json=body, stream=True, timeout=120) as response:
        assert response.status_code == 200
        assert b"[DONE]" in b"".join(response.iter_lines())
    with requests.post(url, json=body, stream=True, timeout=120) as response:
        next(response.iter_lines())  # the first event, then the connection closes
    deadline = time.monotonic() + 30
    while _chat_requests(server, "cancelled") == before["cancelled"]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert _chat_requests(server, "finished") == before["finished"] + 1
    assert _chat_requests(server, "cancelled") == before["cancelled"] + 1


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"modalities": ["text", "audio"], "audio": {"voice": "Nobody", "format": "wav"}}, "voice"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "mp3"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "audio"),
        ({"audio": {"voice": "Ethan", "format": "wav"}}, "modalities"),
        (
            {
                "modalities": ["text", "audio"],
                "audio": {"voice": "Ethan", "format": "wav"},
                "stream": True,
            },
            "audio.format",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "nonsense"}]}]}, "messages"),
        ({"modalities": ["image"]}, "modalities"),
        ({"frequency_of_cats": 3}, "frequency_of_cats"),
    ],
)
def test_bad_requests_get_400_naming_the_field(server, extra, field):
    body = {"model": MODEL, "messages": MESSAGES, **extra}
    response = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200


def test_routes_match_the_graph(server):
    """A speech graph serves chat, not the Images API; its schema and docs answer 200."""
    schema = requests.get(f"{server.url}/openapi.json", timeout=30)
    assert schema.status_code == 200, schema.text
    assert "/v1/chat/completions" in schema.json()["paths"]
    assert "/v1/images/generations" not in schema.json()["paths"]
    assert requests.get(f"{server.url}/docs", timeout=30).status_code == 200
    body = {"model": MODEL, "prompt": "a red cat"}
    assert requests.post(f"{server.url}/v1/images/generations", json=body).status_code == 404


def test_speech_says_the_given_text(server, client):
    # /v1/audio/speech: the text fills the assistant turn, the talker speaks it.
    from vllm_omni.audio_file import decode_audio

    def speak(seed: int) -> bytes:
        return client.audio.speech.create(
            model=MODEL, voice="Chelsie", input="Good morning.", response_format="wav",
            extra_body={"seed": seed},
        ).content  # fmt: skip

    samples, rate = decode_audio(speak(0))
    assert rate == 24_000 and len(samples) > 0 and len(samples) % SAMPLES_PER_CODE == 0
    assert speak(0) == speak(0)  # the seed decides the talker's draws and code2wav's noise
    assert (
        "/v1/audio/speech" in requests.get(f"{server.url}/openapi.json", timeout=30).json()["paths"]
    )
    with pytest.raises(openai.BadRequestError) as error:
        client.audio.speech.create(model=MODEL, voice="alloy", input="Hi.")
    assert error.value.body["param"] == "voice"


def test_vllm_sampling_fields(server, client):
    """Chat takes the sampling fields vLLM's own chat takes, with their meaning: min_tokens
    holds the reply to its length even past the end of text."""
    extra = {
        "min_tokens": 12,
        "top_k": 5,
        "min_p": 0.01,
        "repetition_penalty": 1.1,
        "ignore_eos": False,
        "stop_token_ids": [0],
    }
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, seed=3, stop=["zzz"],
        presence_penalty=0.5, frequency_penalty=0.5, extra_body=extra,
    )  # fmt: skip
    assert reply.usage.completion_tokens == 12
    too_many = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "min_tokens": 3}
    response = requests.post(f"{server.url}/v1/chat/completions", json=too_many, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "min_tokens"


SPEECH_FUZZ_EXAMPLES = (10, 60)  # (valid bodies, each running the graph; invalid ones)


def _check_speech_reply(body: dict, reply: dict) -> None:
    message = reply["choices"][0]["message"]
    assert message["audio"]["transcript"] is not None and message["content"] is None
    # A WAV (a reply of one or two tokens may be too short to speak: no samples).
    assert audio_samples(base64.b64decode(message["audio"]["data"]), "wav").ndim == 1


def test_fuzz_request_bodies_from_the_published_schema(server):
    openapi = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    few = {"type": "integer", "minimum": 1, "maximum": 4}
    cheap = {  # short replies with speech, not streamed (the checks read one JSON reply)
        "messages": {"enum": [MESSAGES, [{"role": "user", "content": "Hi"}]]},
        "modalities": {"enum": [["text", "audio"]]},
        "audio": {"enum": [{"voice": v, "format": "wav"} for v in ("Ethan", "Chelsie")]},
        "stream": {"enum": [False]},
        "max_tokens": few,
        "max_completion_tokens": few,
        "min_tokens": {"type": "integer", "minimum": 0, "maximum": 1},
        # Below the tiny model's vocabulary (a rule the schema states in words only).
        "stop_token_ids": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 2047},
        },
    }
    valid, invalid = SPEECH_FUZZ_EXAMPLES
    tally = fuzz_operation(
        server.url, {}, openapi, "/v1/chat/completions", cheap=cheap,
        check_ok=_check_speech_reply, positive_examples=valid, negative_examples=invalid,
    )  # fmt: skip
    print(tally)
    assert tally.valid == valid and tally.invalid == invalid
    assert tally.accepted_fraction >= 0.9, tally
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
