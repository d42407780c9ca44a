# SPDX-License-Identifier: Apache-2.0
"""OmniLLM on the tiny Qwen3-Omni: the MoE thinker on vLLM writes transformers' greedy tokens
(text and audio prompts) and hands on, per token, the output of the layer the talker reads and
the token's input embedding, equal to transformers' `hidden_states[accept_hidden_layer]` and
`hidden_states[0]`."""

from __future__ import annotations

import pytest
import torch
from vllm import SamplingParams

from ...helpers.hf_reference import one_thread
from ...helpers.media import audio_part

pytestmark = pytest.mark.engine

PROMPT = "<|im_start|>user\nHello there, how are you today?<|im_end|>\n<|im_start|>assistant\n"
THINKER_TOKENS = 24
ROW_TOLERANCE = 1e-4
"""Largest row difference relative to the rows' peak: vLLM's fused MoE and attention sum in
other orders than transformers' eager modules (float32)."""


def hf_thinker(hf, inputs: dict) -> tuple[list[int], tuple[torch.Tensor, ...]]:
    """transformers' greedy reply and the hidden states of every token fed to the thinker."""
    model, _ = hf
    with torch.no_grad(), one_thread():
        out = model.thinker.generate(
            **inputs,
            do_sample=False,
            max_new_tokens=THINKER_TOKENS,
            output_hidden_states=True,
            return_dict_in_generate=True,
        )
    states = tuple(
        torch.cat([step[k] for step in out.hidden_states], dim=1)[0]
        for k in range(len(out.hidden_states[0]))
    )
    return out.sequences[0, inputs["input_ids"].shape[1] :].tolist(), states


def assert_rows_match(rows: torch.Tensor, states, accept: int, placeholder: torch.Tensor) -> None:
    width = states[0].shape[-1]
    assert rows.shape[0] == states[0].shape[0]
    layer, embedding = rows[:, :width].float(), rows[:, width : 2 * width].float()
    expected_embedding = states[0].masked_fill(placeholder[:, None], 0)
    for got, want in [(layer, states[accept]), (embedding, expected_embedding)]:
        error = (got - want).abs().max() / want.abs().max()
        assert error < ROW_TOLERANCE, error


def test_text_tokens_and_rows_match_transformers(omni, hf, captured):
    model, processor = hf
    out = omni.generate(PROMPT, SamplingParams(temperature=0, max_tokens=THINKER_TOKENS))[0]
    inputs = dict(processor(text=PROMPT, return_tensors="pt"))
    tokens, states = hf_thinker(hf, inputs)
    assert out.token_ids == tokens
    rows = captured[out.request_id]["thinker_states"]
    accept = model.config.talker_config.accept_hidden_layer
    assert_rows_match(rows, states, accept, torch.zeros(rows.shape[0], dtype=torch.bool))


def test_audio_prompt_tokens_and_rows_match_transformers(omni, hf, captured):
    # vLLM decodes the message's WAV and extracts Whisper features as transformers' processor
    # does; the placeholder rows carry the layer's output and a zero embedding.
    model, processor = hf
    samples, clip = audio_part(torch.Generator().manual_seed(1))
    question = {"type": "text", "text": "What is this?"}
    request = {"messages": [{"role": "user", "content": [clip, question]}]}
    out = omni.generate(request, SamplingParams(temperature=0, max_tokens=THINKER_TOKENS))[0]

    chat = [{"role": "user", "content": [{"type": "audio"}, question]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = dict(processor(text=text, audio=[samples], return_tensors="pt"))
    assert out.prompt_token_ids == inputs["input_ids"][0].tolist()
    tokens, states = hf_thinker(hf, inputs)
    assert out.token_ids == tokens
    rows = captured[out.request_id]["thinker_states"]
    sequence = torch.tensor(out.prompt_token_ids + out.token_ids[:-1])
    placeholder = sequence == model.config.thinker_config.audio_token_id
    assert placeholder.sum() > 0
    accept = model.config.talker_config.accept_hidden_layer
    assert_rows_match(rows, states, accept, placeholder)
