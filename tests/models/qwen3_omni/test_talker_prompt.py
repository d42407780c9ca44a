# SPDX-License-Identifier: Apache-2.0
"""The talker's input, as transformers builds it: which thinker rows go where, on a prompt whose
rows are the token ids themselves (so each row says which token it is)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from vllm_omni.errors import FieldError
from vllm_omni.models.omni_speech.speech import chatml_speech_prompt
from vllm_omni.models.qwen3_omni.talker_prompt import TalkerSpecials, talker_prompt

PAD, BOS, EOS = -1.0, -2.0, -3.0  # the tts rows, told apart by value


@pytest.fixture(scope="module")
def setup(tiny_models):
    folder = tiny_models["qwen3-omni"]
    loaded = TalkerSpecials.load(folder)
    # Rows of width 1 holding their token's id; the tts rows hold PAD, BOS, EOS.
    specials = TalkerSpecials(**{**vars(loaded), "tts_rows": torch.tensor([[PAD], [BOS], [EOS]])})
    return specials, AutoTokenizer.from_pretrained(folder)


def states_of(ids: list[int]) -> torch.Tensor:
    """[layer | embedding] rows: the embedding is the id, the layer's output id + 0.5 (so a
    row taken from the wrong half shows)."""
    column = torch.tensor(ids, dtype=torch.float)[:, None]
    return torch.cat([column + 0.5, column], dim=1)


def test_user_turns_header_reply_and_end(setup):
    specials, tokenizer = setup
    chat = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
    prompt = tokenizer(chat + "<|im_start|>assistant\n").input_ids
    reply = tokenizer("Fine, thanks<|im_end|>").input_ids
    fed = prompt + reply[:-1]  # the thinker never reads its last token
    out = talker_prompt(states_of(fed), prompt, specials, "Chelsie")
    user = tokenizer("<|im_start|>user\nHello there<|im_end|>\n").input_ids
    header = prompt[-3:]
    expected = [*user, *header, PAD, PAD, PAD, PAD, BOS, *reply[:-1], EOS, PAD]
    assert out.rows[:, 0].tolist() == expected
    assert not out.hidden.any()  # no multimodal tokens
    assert out.codec_from == len(user) + 3
    think = list(specials.codec_think)
    codec = [*think, specials.speakers["chelsie"], specials.codec_pad, specials.codec_bos]
    assert out.ids == [specials.codec_pad] * (len(user) + 3) + codec
    # Frame k reads row len(ids) + k: the reply's token k + 1, then the end, then pad for ever.
    assert out.rows[len(out.ids), 0].item() == reply[1]


def test_speech_prompt_speaks_its_text(setup):
    specials, tokenizer = setup
    text = "The quick brown fox"
    prompt = tokenizer(chatml_speech_prompt(text, None)["prompt"]).input_ids
    out = talker_prompt(states_of(prompt), prompt, specials, "Ethan")  # one token written
    spoken = tokenizer(text).input_ids
    start = out.codec_from + 6 - 1  # the first text row, with the codec start
    assert out.rows[start:, 0].tolist() == [*spoken, EOS, PAD]


def test_a_thinking_stream_waits_for_the_first_reply_row(setup):
    specials, tokenizer = setup
    prompt = tokenizer("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n").input_ids
    assert talker_prompt(states_of(prompt), prompt, specials, "Ethan", finished=False) is None
    with pytest.raises(FieldError, match="prompt: the thinker wrote no reply"):
        talker_prompt(states_of(prompt), prompt, specials, "Ethan")
    with pytest.raises(FieldError, match="voice: unknown voice 'Nobody'"):
        talker_prompt(states_of(prompt + [5]), prompt, specials, "Nobody")


def test_positions_rebase_each_user_turn_and_count_on():
    from vllm_omni.models.qwen3_omni.talker_prompt import talker_positions_table

    # Thinker positions: a system turn (0-2), a user turn with a 1x2x2 image (3-9), an
    # assistant turn (10-11), a user turn (12-13); the talker keeps the user turns only.
    text = lambda a, b: torch.arange(a, b).expand(3, b - a)  # noqa: E731
    image = torch.tensor([[5, 5, 5, 5], [5, 5, 6, 6], [5, 6, 5, 6]])
    thinker = torch.cat([text(0, 5), image, text(7, 8), text(8, 10), text(10, 12)], dim=1)
    user = torch.tensor([3, 4, 5, 6, 7, 8, 9, 12, 13])
    table = talker_positions_table(thinker, user, len(user) + 9)
    assert table[:, :9].tolist() == [
        [0, 1, 2, 2, 2, 2, 4, 5, 6],  # the image keeps its grid; text counts on past it
        [0, 1, 2, 2, 3, 3, 4, 5, 6],
        [0, 1, 2, 3, 2, 3, 4, 5, 6],
    ]  # the second user turn follows the first at 5, 6 (its thinker positions were 10, 11)
    assert table[:, 9:].tolist() == [list(range(7, 16))] * 3  # the assistant rows count on
    plain = torch.arange(12).expand(3, 12)
    assert talker_positions_table(plain, torch.tensor([3, 4, 5]), 12) is None
