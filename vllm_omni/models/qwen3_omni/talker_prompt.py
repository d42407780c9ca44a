# SPDX-License-Identifier: Apache-2.0
"""The Qwen3-Omni talker's input, built as transformers'
`Qwen3OmniMoeForConditionalGeneration.generate` builds it (pinned in `.pinned`).

Every talker position gets a thinker row (thinker width), projected by the talker's
`text_projection` or, at audio, image and video tokens of the user's turns, its
`hidden_projection`; positions from `codec_from` on add the codec embedding of their token:

- the user turns' tokens (system turns are left out): the token's embedding, or the accepted
  layer's output at multimodal tokens;
- the assistant header (`<|im_start|>assistant\\n`): its embeddings, no codec;
- four `tts_pad` rows with the codec ids nothink, think-bos, think-eos and the speaker, a
  `tts_bos` row with the codec pad and the first reply token's embedding with the codec start;
- then, one per generated frame, the next reply token's embedding, `tts_eos` after the reply
  (transformers leaves out the thinker's last token, its end token) and `tts_pad` for ever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_omni.errors import FieldError
from vllm_omni.models.talker_common import thinker_embedding_rows


@dataclass(frozen=True)
class TalkerSpecials:
    """What the talker's input needs from the checkpoint besides the talker's weights."""

    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_think: tuple[int, int, int]  # nothink, think-bos, think-eos
    speakers: dict[str, int]  # voice (lower case) -> codec id
    im_start: int
    user: int
    assistant: int
    placeholders: tuple[int, ...]  # audio, image and video tokens of the thinker
    codebook_size: int
    vocab_size: int
    num_code_groups: int
    tts_rows: torch.Tensor  # [3, thinker hidden]: embeddings of tts_pad, tts_bos, tts_eos

    @classmethod
    def load(cls, folder: str | Path) -> TalkerSpecials:
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        talker, thinker = config["talker_config"], config["thinker_config"]
        tts = [config["tts_pad_token_id"], config["tts_bos_token_id"], config["tts_eos_token_id"]]
        return cls(
            codec_pad=talker["codec_pad_id"],
            codec_bos=talker["codec_bos_id"],
            codec_eos=talker["codec_eos_token_id"],
            codec_think=(
                talker["codec_nothink_id"],
                talker["codec_think_bos_id"],
                talker["codec_think_eos_id"],
            ),
            speakers={k.lower(): v for k, v in talker["speaker_id"].items()},
            im_start=config["im_start_token_id"],
            user=config["user_token_id"],
            assistant=config["assistant_token_id"],
            placeholders=tuple(
                thinker[k] for k in ("audio_token_id", "image_token_id", "video_token_id")
            ),
            codebook_size=talker["code_predictor_config"]["vocab_size"],
            vocab_size=talker["text_config"]["vocab_size"],
            num_code_groups=talker["num_code_groups"],
            tts_rows=thinker_embedding_rows(folder, tts).float(),
        )

    def speaker(self, voice: str) -> int:
        found = self.speakers.get(voice.lower())
        if found is None:
            raise FieldError("voice", f"unknown voice {voice!r}; known: {self.voice_names}")
        return found

    @property
    def voice_names(self) -> list[str]:
        return sorted(v.capitalize() for v in self.speakers)


@dataclass(frozen=True)
class TalkerPrompt:
    ids: list[int]  # the talker's prompt token ids (codec ids; pads where no codec is added)
    rows: torch.Tensor  # [positions, thinker hidden]: the prompt's rows, then one per frame
    hidden: torch.Tensor  # [positions] bool: rows that go through `hidden_projection`
    codec_from: int  # positions before it leave out the codec embedding
    positions: torch.Tensor | None = None  # [3, prompt] M-RoPE positions, where not 1-D


def user_positions(prompt_ids: list[int], specials: TalkerSpecials) -> list[int]:
    """Positions of the prompt's tokens in user turns (each turn from its <|im_start|>)."""
    positions, role = [], None
    for i, token in enumerate(prompt_ids):
        if token == specials.im_start:
            role = prompt_ids[i + 1] if i + 1 < len(prompt_ids) else None
        if role == specials.user:
            positions.append(i)
    return positions


def talker_prompt(
    states: torch.Tensor,
    prompt_ids: list[int],
    specials: TalkerSpecials,
    voice: str,
    finished: bool = True,
) -> TalkerPrompt | None:
    """The talker's prompt and per-frame rows from the thinker's output: `states`
    [prompt + reply - 1, >= 2 x hidden] rows of [accepted layer | embedding] (the thinker
    stage's `thinker_states`), `prompt_ids` the thinker prompt's token ids. With `finished`
    False (the thinker is still writing) the rows end at its newest token, and None says that
    the first reply token's row has not come yet."""
    width = specials.tts_rows.shape[-1]
    states = states.float()
    layer, embedding = states[:, :width], states[:, width : 2 * width]
    starts = [
        i
        for i in range(len(prompt_ids) - 1)
        if prompt_ids[i] == specials.im_start and prompt_ids[i + 1] == specials.assistant
    ]
    if not starts:
        raise FieldError("prompt", "the talker needs a prompt that ends an assistant turn header")
    start = starts[-1]
    if states.shape[0] < start + 4:
        if not finished:
            return None
        raise FieldError("prompt", "the thinker wrote no reply for the talker to speak")
    user = torch.tensor(user_positions(prompt_ids, specials), dtype=torch.long)
    is_placeholder = torch.isin(torch.tensor(prompt_ids)[user], torch.tensor(specials.placeholders))
    user_rows = torch.where(is_placeholder[:, None], layer[user], embedding[user])
    pad, bos, eos = specials.tts_rows
    assistant = embedding[start:]
    rows = torch.cat(
        [user_rows, assistant[:3], pad.expand(4, -1), bos[None], assistant[3:4], assistant[4:]]
    )
    if finished:
        rows = torch.cat([rows, eos[None], pad[None]])  # the reply's end, then pad for ever
    hidden = torch.zeros(rows.shape[0], dtype=torch.bool)
    hidden[: len(user)] = is_placeholder
    codec = [*specials.codec_think, specials.speaker(voice), specials.codec_pad, specials.codec_bos]
    ids = [specials.codec_pad] * (len(user) + 3) + codec
    positions = None
    if states.shape[1] >= 2 * width + 3:  # the thinker's M-RoPE positions ride with its rows
        thinker_positions = states[:, 2 * width : 2 * width + 3].round().long().T
        positions = talker_positions_table(thinker_positions, user, len(ids))
    return TalkerPrompt(ids, rows, hidden, codec_from=len(user) + 3, positions=positions)


def talker_positions_table(
    thinker: torch.Tensor, user: torch.Tensor, length: int
) -> torch.Tensor | None:
    """[3, length] M-RoPE positions of the talker's prompt, as transformers' `get_rope_index`
    gives them over the talker's own tokens: each user turn keeps its thinker positions (images
    and videos spread over time, height and width), moved to follow the turn before; the
    assistant rows count on. None where that is plain 1-D (text and audio prompts)."""
    table, next_position, start = [], 0, 0
    user = user.tolist()
    for i in range(1, len(user) + 1):
        if i == len(user) or user[i] != user[i - 1] + 1:  # the end of a run of user tokens
            run = thinker[:, user[start:i]]
            run = run - run[:, :1] + next_position  # a turn starts with <|im_start|>: text
            table.append(run)
            next_position, start = int(run.max()) + 1, i
    rest = length - len(user)
    table.append(torch.arange(next_position, next_position + rest).expand(3, rest))
    positions = torch.cat(table, dim=1)
    return None if torch.equal(positions, torch.arange(length).expand(3, length)) else positions
