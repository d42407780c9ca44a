# SPDX-License-Identifier: Apache-2.0
"""OmniLLM end to end on the tiny Qwen3-Omni: thinker and talker (with its code predictor) on
real vLLM engines, code2wav in its process stage. Text tokens, every codebook's codes and the
waveform must equal transformers' `Qwen3OmniMoeForConditionalGeneration.generate` with the same
weights (float32, greedy)."""

from __future__ import annotations

import pytest
import torch
from vllm import SamplingParams

from ...helpers.hf_reference import one_thread
from ...helpers.media import audio_part, image_part

pytestmark = pytest.mark.engine

PROMPT = "<|im_start|>user\nHello there, how are you today?<|im_end|>\n<|im_start|>assistant\n"
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
THINKER_TOKENS, TALKER_TOKENS = 24, 40
WAVE_TOLERANCE = 1e-4
"""Largest waveform difference relative to the reference's peak: code2wav runs transformers'
modules in its own process, on its own threads (float32)."""


def stage_params(talker_tokens: int = TALKER_TOKENS) -> dict:
    return {
        "thinker": SamplingParams(temperature=0, max_tokens=THINKER_TOKENS),
        # transformers' talker defaults, greedy: repetition penalty 1.05 stays on
        "talker": SamplingParams(temperature=0, max_tokens=talker_tokens, repetition_penalty=1.05),
    }


def hf_generate(hf, inputs: dict, voice: str) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """transformers' reply tokens, codes [G, frames] and waveform."""
    model, _ = hf
    captured = {}
    decode = model.code2wav.chunked_decode

    def capture(codes, *args, **kwargs):
        captured["codes"] = codes[0]
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = capture
    try:
        with torch.no_grad(), one_thread():
            sequences, wav = model.generate(
                **inputs,
                speaker=voice,
                thinker_max_new_tokens=THINKER_TOKENS,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=TALKER_TOKENS,
            )
    finally:
        model.code2wav.chunked_decode = decode
    reply = sequences[0, inputs["input_ids"].shape[1] :].tolist()
    return reply, captured["codes"], wav.reshape(-1)


@pytest.mark.parametrize("prompt, voice", [(PROMPT, "Ethan"), (SYSTEM + PROMPT, "Chelsie")])
def test_text_codes_and_waveform_match_transformers(omni, hf, prompt, voice):
    _, processor = hf
    out = omni.generate({"prompt": prompt, "voice": voice}, stage_params(), use_tqdm=False)[0]
    reply, codes, wav = hf_generate(hf, dict(processor(text=prompt, return_tensors="pt")), voice)
    assert out.token_ids == reply
    assert codes.shape[1] > 0 and out.codec_token_ids == codes.tolist()
    assert out.sample_rate == 24_000 and out.audio.shape == wav.shape
    assert (out.audio - wav).abs().max() <= WAVE_TOLERANCE * wav.abs().max()


def test_audio_prompt_matches_transformers(omni, hf):
    # The talker reads the accepted layer's output at the audio tokens of the user's turn.
    _, processor = hf
    samples, clip = audio_part(torch.Generator().manual_seed(1))
    question = {"type": "text", "text": "What is this?"}
    request = {"messages": [{"role": "user", "content": [clip, question]}]}
    out = omni.generate(request, stage_params(), use_tqdm=False)[0]

    chat = [{"role": "user", "content": [{"type": "audio"}, question]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(text=text, audio=[samples], return_tensors="pt"))
    reply, codes, _ = hf_generate(hf, inputs, "Ethan")
    assert out.token_ids == reply
    assert out.codec_token_ids == codes.tolist()


def test_image_prompt_matches_transformers(omni, hf):
    # transformers positions the talker with M-RoPE over its own tokens: the image's tokens
    # spread over height and width (a 2x4 grid after merging), so 1-D positions would change
    # the codes; a system turn before it is left out of the talker's input.
    _, processor = hf
    image, picture = image_part(torch.Generator().manual_seed(0), height=64, width=128)
    question = {"type": "text", "text": "What is this?"}
    system = {"role": "system", "content": "Be brief."}
    request = {"messages": [system, {"role": "user", "content": [picture, question]}]}
    out = omni.generate({**request, "voice": "Aiden"}, stage_params(), use_tqdm=False)[0]

    chat = [system, {"role": "user", "content": [{"type": "image"}, question]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(text=text, images=[image], return_tensors="pt"))
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 8]]
    reply, codes, _ = hf_generate(hf, inputs, "Aiden")
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()  # the image's 8 tokens too
    assert out.token_ids == reply
    assert out.codec_token_ids == codes.tolist()


def test_concurrent_requests_match_solo_runs(omni):
    prompts = [PROMPT, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"]
    alone = [omni.generate(p, stage_params(), use_tqdm=False)[0] for p in prompts]
    together = omni.generate(prompts, stage_params(), use_tqdm=False)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.codec_token_ids == b.codec_token_ids
        assert torch.equal(a.audio, b.audio)


def test_text_only_request_skips_the_speech_stages(omni):
    before = omni.get_stage_stats()
    request = {"prompt": PROMPT, "modalities": ["text"]}
    out = omni.generate(request, stage_params(), use_tqdm=False)[0]
    after = omni.get_stage_stats()
    assert out.text and out.audio is None and out.codec_token_ids is None
    assert after["talker"]["num_finished"] == before["talker"]["num_finished"]


@pytest.mark.parametrize(
    "prompt, error",
    [
        ({"prompt": PROMPT, "voice": "Nobody"}, r"voice: unknown voice 'Nobody'"),
        ({"prompt": PROMPT, "modalities": ["image"]}, r"modalities: 'image' is not an output"),
    ],
)
def test_bad_requests_name_the_field(omni, prompt, error):
    with pytest.raises(ValueError, match=error):
        omni.generate(prompt, use_tqdm=False)


def windowed_reference(hf, codes: torch.Tensor) -> torch.Tensor:
    """transformers' code2wav on the streamed windows: chunks of 4 frames, then 25, each with
    up to 25 frames of left context whose samples are cut, less what every decode leaves off
    its end (vllm_omni.models.qwen3_omni.code2wav)."""
    model, _ = hf
    upsample, kept, pieces = int(model.code2wav.total_upsample), 0, []
    with torch.no_grad(), one_thread():
        while kept < codes.shape[1]:
            end = min(codes.shape[1], kept + (4 if kept == 0 else 25))
            start = max(0, kept - 25)
            wav = model.code2wav(codes[None, :, start:end]).reshape(-1)
            lost = (end - start) * upsample - wav.shape[0]
            pieces.append(wav[(kept - start) * upsample - lost :] if kept else wav)
            kept = end
    return torch.cat(pieces)


def long_params(seed: int | None = None) -> dict:
    params = stage_params(talker_tokens=120)
    params["thinker"] = SamplingParams(temperature=0, max_tokens=64)
    if seed is not None:
        params["talker"] = SamplingParams(
            temperature=0.9, top_k=50, repetition_penalty=1.05, seed=seed, max_tokens=120
        )
    return params


def streamed(omni, prompt: dict, params: dict):
    async def run():
        events: list = []
        inputs, prepared = omni.engine.prepare({**prompt, "stream": True}, params)
        out = await omni.engine.run_prepared(inputs, prepared, on_event=events.append)
        return out, events

    return omni._call(run())


def test_streamed_request_speaks_while_the_thinker_writes(omni, hf):
    from vllm_omni.engine.request_run import StageDelta

    prompt = {"prompt": PROMPT, "voice": "Chelsie"}
    whole = omni.generate(prompt, long_params(), use_tqdm=False)[0]
    out, events = streamed(omni, prompt, long_params())
    assert out.token_ids == whole.token_ids
    assert out.codec_token_ids == whole.codec_token_ids  # greedy: segments change nothing
    assert len(whole.codec_token_ids[0]) == 119
    deltas = [e for e in events if isinstance(e, StageDelta)]
    chunks = [e.data["audio"] for e in deltas if "audio" in e.data]
    assert len(chunks) >= 3
    assert torch.equal(torch.cat(chunks), out.audio)
    # As long as the whole decode; each chunk as transformers' code2wav decodes its window.
    # (The tiny model's random decoder saturates 98% of its samples at +-1, so a window with 25
    # frames of context flips many of them against the whole decode: 0.32 relative RMS.)
    assert out.audio.shape == whole.audio.shape
    reference = windowed_reference(hf, torch.tensor(out.codec_token_ids))
    assert (out.audio - reference).abs().max() <= WAVE_TOLERANCE * reference.abs().max()
    frames = [e.data["codec_tokens"] for e in deltas if "codec_tokens" in e.data]
    assert torch.equal(torch.cat(frames, dim=1), torch.tensor(out.codec_token_ids))
    # The talker began before the thinker's last rows came: its first frames left first.
    first_frames = next(i for i, e in enumerate(deltas) if "codec_tokens" in e.data)
    last_text = max(i for i, e in enumerate(deltas) if "text" in e.data)
    assert first_frames < last_text


def test_seeded_sampling_speaks_the_same_streamed_or_not(omni):
    # Segments have fixed lengths and each seeds its own draws (talker and code predictor)
    # from the request's seed and its index: the thinker's pace cannot change the codes.
    prompt = {"prompt": PROMPT, "voice": "Ethan"}
    whole = omni.generate(prompt, long_params(seed=11), use_tqdm=False)[0]
    first, _ = streamed(omni, prompt, long_params(seed=11))
    assert first.codec_token_ids == whole.codec_token_ids
    other = omni.generate(prompt, long_params(seed=12), use_tqdm=False)[0]
    assert other.codec_token_ids != whole.codec_token_ids  # the seed does draw the codes
