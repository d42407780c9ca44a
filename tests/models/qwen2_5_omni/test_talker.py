# SPDX-License-Identifier: Apache-2.0
"""The talker's positions: the thinker prompt's M-RoPE index, then one per token, as transformers'
talker computes them (its get_rope_index on the thinker prompt plus rope_deltas after it)."""

from __future__ import annotations

import torch

from vllm_omni.models.qwen2_5_omni.talker import TalkerSpecials, talker_input
from vllm_omni.models.qwen2_5_omni.talker_worker import decode_payload, encode_payload
from vllm_omni.models.talker_common import talker_positions

# A 6-token thinker prompt: two text tokens, a 1x2x2 image grid after merging (t fixed, h and w
# vary), two text tokens resuming after the image's largest position.
TABLE = torch.tensor(
    [
        [0, 1, 2, 2, 2, 2, 4, 5],
        [0, 1, 2, 2, 3, 3, 4, 5],
        [0, 1, 2, 3, 2, 3, 4, 5],
    ]
)


def test_prompt_positions_come_from_the_table_then_continue_past_its_maximum() -> None:
    whole = talker_positions(TABLE, 0, 12)
    assert torch.equal(whole[:, :8], TABLE)
    # delta = max 5 + 1 - 8 = -2: token 8 sits at 6 on every axis, as transformers' rope_deltas
    assert whole[:, 8:].tolist() == [[6, 7, 8, 9]] * 3
    # Any span (a chunked prefill, one decode step) is the same slice of it.
    assert torch.equal(talker_positions(TABLE, 5, 4), whole[:, 5:9])
    assert torch.equal(talker_positions(TABLE, 11, 1), whole[:, 11:12])


def test_text_prompts_keep_1d_positions() -> None:
    text = torch.arange(5).expand(3, 5)
    assert torch.equal(talker_positions(text, 0, 9), torch.arange(9).expand(3, 9))
    assert torch.equal(talker_positions(None, 3, 4), torch.arange(3, 7).expand(3, 4))


def test_payload_carries_the_positions() -> None:
    rows = torch.randn(10, 4)
    decoded_rows, codec_from, positions = decode_payload(encode_payload(rows, 8, TABLE))
    assert torch.equal(decoded_rows, rows) and codec_from == 8 and torch.equal(positions, TABLE)
    assert decode_payload(encode_payload(rows, 8))[2] is None


def test_talker_input_splits_the_thinkers_position_columns() -> None:
    hidden = 4
    specials = TalkerSpecials(
        codec_pad=60, codec_bos=61, codec_eos=62, codec_mask=63, vocab_size=64,
        voices={"Chelsie": torch.ones(hidden)}, text_eos=torch.zeros(hidden),
        text_pad=torch.zeros(hidden),
    )  # fmt: skip
    states = torch.randn(10, 2 * hidden)  # 8 prompt rows, 2 reply rows
    with_positions = torch.cat(
        [states, torch.cat([TABLE, TABLE[:, -1:] + 1 + torch.arange(2)], 1).T.float()], 1
    )
    plain = talker_input(states, 8, specials, "Chelsie")
    mrope = talker_input(with_positions, 8, specials, "Chelsie")
    assert plain.positions is None
    assert torch.equal(mrope.positions, TABLE)
    assert torch.equal(mrope.rows, plain.rows) and mrope.ids == plain.ids


def test_the_reply_starts_after_the_last_assistant_header(tiny_models) -> None:
    # A chat prompt ends with the header: the reply is what the thinker writes. A speech
    # request's prompt holds the text to say in the assistant turn: the reply starts there.
    from transformers import AutoTokenizer

    from vllm_omni.models.omni_speech.speech import chatml_speech_prompt

    folder = tiny_models["qwen2.5-omni"]
    specials = TalkerSpecials.load(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat = tokenizer("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n").input_ids
    assert specials.reply_start(chat) == len(chat)
    speech = tokenizer(chatml_speech_prompt("Good morning", None)["prompt"]).input_ids
    start = specials.reply_start(speech)
    assert tokenizer.decode(speech[start:]) == "Good morning"
    # An earlier turn's text is not spoken, nor is a prompt without a header.
    earlier = speech + tokenizer("<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n").input_ids
    assert specials.reply_start(earlier) == len(earlier)
    plain = tokenizer("Once upon a time").input_ids
    assert specials.reply_start(plain) == len(plain)
