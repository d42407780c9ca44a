# SPDX-License-Identifier: Apache-2.0
"""OmniLLM end to end on the tiny Qwen2.5-Omni: thinker and talker on real vLLM engines, code2wav
in its DiT stage process. Text tokens, speech codes and the waveform must equal transformers'
`Qwen2_5OmniForConditionalGeneration` with the same weights (float32, greedy).

transformers 5.19's `generate` drops an all-ones attention mask before the talker's first
forward, and with it the branch that adds the codec pad/start embeddings to the talker's prompt
(modeling_qwen2_5_omni.py, talker `forward`): an unpadded batch decodes without them, a padded
one with them. The pipeline builds the prompt with them (the model's design; also what a padded
batch gets), so the reference is a batch with one left-padded row and the unpadded row is compared.
"""

from __future__ import annotations

import pytest
import torch
from vllm import SamplingParams

from vllm_omni import Code2WavParams, OmniLLM

from ...helpers.hf_reference import one_thread
from ...helpers.media import audio_part, image_part

pytestmark = pytest.mark.engine

PROMPT = "<|im_start|>user\nHello there, how are you today?<|im_end|>\n<|im_start|>assistant\n"
OTHER = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
THINKER_TOKENS, TALKER_TOKENS, SEED = 24, 40, 7
CODEC_PAD, CODEC_BOS, CODEC_EOS = 60, 61, 62
SAMPLES_PER_CODE = 480
WAVE_TOLERANCE = 1e-3
"""Largest waveform difference, relative to the reference's peak. The DiT process runs
transformers' token2wav modules, its attention through vllm_omni's block-band function (within
4.2e-4 in-process, test_code2wav.py), on the process's default threads, which changes
summation order in the 10-step ODE solve too."""


def stage_params(seed: int = SEED, voice: str = "Chelsie") -> dict:
    return {
        "thinker": SamplingParams(temperature=0, max_tokens=THINKER_TOKENS),
        # transformers' talker defaults, greedy: repetition penalty 1.05 stays on
        "talker": SamplingParams(temperature=0, max_tokens=TALKER_TOKENS, repetition_penalty=1.05),
        "code2wav": Code2WavParams(seed=seed, voice=voice),
    }


@pytest.fixture(scope="module")
def omni(tiny_models):
    # Eager: `make demo` runs this graph compiled (its check fails CI too), and compiling two
    # engines here would cost about a minute of the suite's time.
    float32 = {"engine_args": {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True}}
    llm = OmniLLM(
        tiny_models["qwen2.5-omni"], stage_overrides={"thinker": float32, "talker": float32}
    )
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def hf(tiny_models):
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    folder = tiny_models["qwen2.5-omni"]
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(folder)


def hf_reference(hf, prompt: str, voice: str) -> tuple[list[int], list[int]]:
    """transformers' thinker tokens and talker codes (cut at the first end code) for `prompt`."""
    _, tokenizer = hf
    ids, short = tokenizer.encode(prompt), tokenizer.encode("Hi")
    pad = [0] * (len(ids) - len(short))
    input_ids = torch.tensor([ids, pad + short])
    mask = torch.tensor([[1] * len(ids), [0] * len(pad) + [1] * len(short)])
    return hf_generate(hf, {"input_ids": input_ids, "attention_mask": mask}, voice)


def hf_generate(hf, inputs: dict, voice: str) -> tuple[list[int], list[int]]:
    """transformers' `generate` on processor outputs whose first row is the request (unpadded)."""
    model, _ = hf
    captured = {}
    generate = model.talker.generate

    def capture(*args, **kwargs):
        captured["codes"] = out = generate(*args, **kwargs)
        captured["prompt"] = kwargs["input_ids"].shape[1]
        return out

    model.talker.generate = capture
    try:
        with one_thread():
            sequences, _ = model.generate(
                **inputs,
                speaker=voice,
                thinker_max_new_tokens=THINKER_TOKENS,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=TALKER_TOKENS,
                talker_eos_token_id=[CODEC_PAD, CODEC_EOS],
            )
    finally:
        model.talker.generate = generate
    codes = captured["codes"][0, captured["prompt"] :].tolist()
    ends = [i for i, c in enumerate(codes) if c in (CODEC_PAD, CODEC_EOS)]
    text_ids = sequences[0, inputs["input_ids"].shape[1] :].tolist()
    return text_ids, codes[: ends[0]] if ends else codes


def hf_waveform(hf, codes: list[int], voice: str, seed: int) -> torch.Tensor:
    model, _ = hf
    speaker = model.speaker_map[voice]
    torch.manual_seed(seed)
    with torch.no_grad(), one_thread():
        wav = model.token2wav(
            torch.tensor([codes]),
            conditioning=speaker["cond"].float()[None],
            reference_mel=speaker["ref_mel"].float(),
        )
    return wav.reshape(-1).float()


@pytest.mark.parametrize("voice", ["Chelsie", "Ethan"])
def test_text_codes_and_waveform_match_transformers(omni, hf, voice):
    out = omni.generate({"prompt": PROMPT, "voice": voice}, stage_params(), use_tqdm=False)[0]
    text_ids, codes = hf_reference(hf, PROMPT, voice)
    assert out.token_ids == text_ids
    assert out.text
    assert len(codes) > 0
    assert out.codec_token_ids == codes
    assert out.sample_rate == 24000
    assert out.audio.shape == (len(codes) * SAMPLES_PER_CODE,)
    reference = hf_waveform(hf, codes, voice, SEED)
    diff = (out.audio - reference).abs().max().item() / reference.abs().max().item()
    print(f"waveform: max |diff| / peak = {diff:.2e}")
    assert diff <= WAVE_TOLERANCE


def test_image_prompt_text_and_codes_match_transformers(omni, hf, tiny_models):
    # transformers positions the talker with the thinker prompt's M-RoPE index: image tokens get
    # height/width positions (a 4x8 patch grid here), so 1-D positions would change the codes.
    from transformers import AutoProcessor

    image, picture = image_part(torch.Generator().manual_seed(0))
    question = {"type": "text", "text": "What is this?"}
    messages = [{"role": "user", "content": [picture, question]}]
    request = {"messages": messages, "voice": "Chelsie"}
    out = omni.generate(request, stage_params(), use_tqdm=False)[0]

    processor = AutoProcessor.from_pretrained(tiny_models["qwen2.5-omni"])
    chat = [{"role": "user", "content": [{"type": "image"}, question]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(text=[text, "Hi"], images=[image], return_tensors="pt",
                            padding=True, padding_side="left"))  # fmt: skip
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 8]]
    inputs["thinker_pixel_values"] = inputs.pop("pixel_values")  # the talker takes no pixels
    text_ids, codes = hf_generate(hf, inputs, "Chelsie")
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()  # the image's 8 tokens too
    assert out.token_ids == text_ids
    assert len(codes) > 0 and out.codec_token_ids == codes


def test_audio_prompt_text_and_codes_match_transformers(omni, hf, tiny_models):
    # vLLM decodes the message's WAV (soundfile) and extracts Whisper features as transformers'
    # processor does; the talker's positions are the thinker's (1-D for audio tokens).
    from transformers import AutoProcessor

    samples, clip = audio_part(torch.Generator().manual_seed(1))  # 1 s at 16 kHz
    question = {"type": "text", "text": "What is this?"}
    messages = [{"role": "user", "content": [clip, question]}]
    request = {"messages": messages, "voice": "Ethan"}
    out = omni.generate(request, stage_params(voice="Ethan"), use_tqdm=False)[0]

    processor = AutoProcessor.from_pretrained(tiny_models["qwen2.5-omni"])
    chat = [{"role": "user", "content": [{"type": "audio"}, question]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(text=[text, "Hi"], audio=[samples], return_tensors="pt",
                            padding=True, padding_side="left"))  # fmt: skip
    inputs["thinker_input_features"] = inputs.pop("input_features")
    text_ids, codes = hf_generate(hf, inputs, "Ethan")
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()  # the audio's tokens too
    assert out.token_ids == text_ids
    assert len(codes) > 0 and out.codec_token_ids == codes


def test_concurrent_requests_match_solo_runs(omni):
    alone = [omni.generate(p, stage_params(), use_tqdm=False)[0] for p in (PROMPT, OTHER)]
    together = omni.generate([PROMPT, OTHER], stage_params(), use_tqdm=False)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.codec_token_ids == b.codec_token_ids
        assert torch.equal(a.audio, b.audio)


def test_text_only_request_skips_the_speech_stages(omni):
    before = omni.get_stage_stats()
    out = omni.generate({"prompt": PROMPT, "modalities": ["text"]}, stage_params(), use_tqdm=False)[
        0
    ]
    after = omni.get_stage_stats()
    assert out.text and out.audio is None and out.codec_token_ids is None
    assert after["thinker"]["num_finished"] == before["thinker"]["num_finished"] + 1
    assert after["talker"]["num_finished"] == before["talker"]["num_finished"]
    assert after["code2wav"]["num_finished"] == before["code2wav"]["num_finished"]


@pytest.mark.parametrize(
    "prompt, error",
    [
        ({"prompt": PROMPT, "voice": "Nobody"}, r"voice: unknown voice 'Nobody'"),
        ({"prompt": PROMPT, "modalities": ["image"]}, r"modalities: 'image' is not an output"),
        (
            {"prompt": PROMPT, "modalities": ["text"], "voice": "Ethan"},
            r"voice: no stage of this request takes it",
        ),
    ],
)
def test_bad_requests_name_the_field(omni, prompt, error):
    with pytest.raises(ValueError, match=error):
        omni.generate(prompt, use_tqdm=False)


STREAM_TOLERANCE = 0.05
"""Largest difference between the joined streamed audio and the whole decode, relative to its
peak: a chunk sees only its window of codes (test_code2wav.py measures it)."""


def test_streamed_request_speaks_while_the_thinker_writes(omni):
    from vllm_omni.engine.request_run import StageDelta

    prompt = {"prompt": PROMPT, "voice": "Chelsie"}
    params = stage_params()
    params["thinker"] = SamplingParams(temperature=0, max_tokens=64)
    # No end code (the start code is never sampled): 160 codes, several audio chunks.
    params["talker"] = SamplingParams(
        temperature=0, max_tokens=160, repetition_penalty=1.05, stop_token_ids=[CODEC_BOS]
    )
    whole = omni.generate(prompt, params, use_tqdm=False)[0]

    async def streamed():
        inputs, prepared = omni.engine.prepare({**prompt, "stream": True}, params)
        events: list = []
        out = await omni.engine.run_prepared(inputs, prepared, on_event=events.append)
        return out, events

    out, events = omni._call(streamed())
    assert out.token_ids == whole.token_ids
    assert out.codec_token_ids == whole.codec_token_ids  # greedy: segments change nothing
    chunks = [e.data["audio"] for e in events if isinstance(e, StageDelta) and "audio" in e.data]
    assert len(chunks) >= 2
    assert torch.equal(torch.cat(chunks), out.audio)
    assert out.audio.shape == whole.audio.shape
    error = (out.audio - whole.audio).abs().max().item() / whole.audio.abs().max().item()
    print(f"streamed vs whole decode: max |diff| / peak = {error:.2e}")
    assert error <= STREAM_TOLERANCE
    # The talker's codes and the audio leave in pieces, as they are made. When each piece
    # arrives depends on how busy the two cores are; benchmarks/omni_audio.py measures the time
    # to first audio.
    codes = [e for e in events if isinstance(e, StageDelta) and "codec_tokens" in e.data]
    assert len(codes) >= 2
    assert sum(len(e.data["codec_tokens"]) for e in codes) == len(out.codec_token_ids)


def test_seeded_sampling_speaks_the_same_streamed_or_not(omni):
    # Each talker segment seeds its own draws from the request's seed and its index, and the
    # segments have fixed lengths, so the thinker's pace cannot change the codes.
    prompt = {"prompt": PROMPT, "voice": "Ethan"}

    def params(seed: int) -> dict:
        p = stage_params(seed=seed, voice="Ethan")
        p["thinker"] = SamplingParams(temperature=0, max_tokens=48)
        p["talker"] = SamplingParams(
            temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05, seed=seed,
            max_tokens=100, stop_token_ids=[CODEC_BOS],  # no end code: segments of 16, 32, 52
        )  # fmt: skip
        return p

    async def streamed(seed: int):
        inputs, prepared = omni.engine.prepare({**prompt, "stream": True}, params(seed))
        return await omni.engine.run_prepared(inputs, prepared)

    whole = omni.generate(prompt, params(11), use_tqdm=False)[0]
    first, second = omni._call(streamed(11)), omni._call(streamed(11))
    assert len(whole.codec_token_ids) == 100
    assert first.codec_token_ids == second.codec_token_ids == whole.codec_token_ids
    other = omni.generate(prompt, params(12), use_tqdm=False)[0]
    assert other.codec_token_ids != whole.codec_token_ids  # the seed does draw the codes


def test_a_cpp_scheduled_thinker_also_hands_on_its_hidden_states(omni, tiny_models):
    """Worker features compose: the thinker's worker runs CPP's step hook and the hidden-state
    hook together. With a 16-token budget the prompt prefills in chunks, so the rows of the
    first chunks wait in the worker for the first sampled token. Tokens, codes and audio equal
    the plain thinker's."""
    thinker = {
        "scheduler": "cpp",
        "engine_args": {
            "dtype": "float32",
            "max_model_len": 2048,
            "enforce_eager": True,
            "max_num_batched_tokens": 16,
        },
    }
    talker = {"engine_args": {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True}}
    cpp = OmniLLM(
        tiny_models["qwen2.5-omni"], stage_overrides={"thinker": thinker, "talker": talker}
    )
    try:
        engine = cpp.engine.stages["thinker"].engine
        assert engine.vllm_config.scheduler_config.scheduler_cls.endswith("CPPScheduler")
        hooks = engine.vllm_config.additional_config["omni_worker_hooks"]
        assert hooks == ["cpp", "hidden_states"]
        got = cpp.generate(PROMPT, stage_params(), use_tqdm=False)[0]
    finally:
        cpp.shutdown()
    want = omni.generate(PROMPT, stage_params(), use_tqdm=False)[0]
    assert len(got.prompt_token_ids) > 16  # prefilled in more than one step
    assert got.token_ids == want.token_ids
    assert got.codec_token_ids == want.codec_token_ids and got.codec_token_ids
    # The same codes, voice and seed in another stage process: the same waveform.
    assert torch.allclose(got.audio, want.audio, rtol=0, atol=1e-6)
