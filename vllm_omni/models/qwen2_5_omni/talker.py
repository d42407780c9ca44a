# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-Omni's talker stage (processor `qwen25_omni_talker`): speech-codec tokens from the
thinker's hidden states.

Builds the talker's input exactly as transformers' `Qwen2_5OmniForConditionalGeneration.generate`
does (`talker_input`) and runs it on the project's talker model
(vllm_omni.models.qwen2_5_omni.talker_model, conditioned per token by the `talker_conditioning`
worker hook); passes on `codec_tokens`, cut at the first end token.
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_omni.engine.ar_processor import Generator
from vllm_omni.errors import FieldError
from vllm_omni.models.talker_common import (
    draws_from_seed,
    finished_thinker,
    segment_seed,
    thinker_embedding_rows,
)

DEFAULT_VOICE = "Chelsie"
TALKER_HOOK = "qwen25_omni_talker"
"""The talker's worker hook (talker_worker.TalkerConditioningHook), as the family registers it."""
TALKER_MAX_TOKENS = 4096
# transformers' talker sampling defaults (Qwen2_5OmniForConditionalGeneration.generate).
TALKER_SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05)


@dataclass(frozen=True)
class TalkerSpecials:
    """What the talker needs from the checkpoint besides its own weights."""

    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_mask: int
    vocab_size: int
    voices: dict[str, torch.Tensor]  # voice -> thinker embedding of its start token
    text_eos: torch.Tensor  # thinker embedding of the talker's text-end token
    text_pad: torch.Tensor  # ... and of its text-pad token
    header: tuple[int, ...] = ()  # token ids of the assistant turn's header

    def reply_start(self, prompt_ids: list[int]) -> int:
        """Where the reply the talker speaks begins: after the prompt, or, when the prompt's last
        assistant turn already holds text (a speech request's), after that turn's header."""
        n = len(self.header)
        for start in range(len(prompt_ids) - n, -1, -1):
            if n and tuple(prompt_ids[start : start + n]) == self.header:
                # the last turn only: no <|im_start|> after it
                return len(prompt_ids) if self.header[0] in prompt_ids[start + n :] else start + n
        return len(prompt_ids)

    @classmethod
    def load(cls, folder: str | Path) -> TalkerSpecials:
        folder = Path(folder)
        talker = json.loads((folder / "config.json").read_text())["talker_config"]
        speakers = torch.load(folder / "spk_dict.pt", weights_only=True)
        names = sorted(speakers)
        ids = [speakers[n]["bos_token"] for n in names] + [
            talker["tts_text_end_token_id"],
            talker["tts_text_pad_token_id"],
        ]
        rows = thinker_embedding_rows(folder, ids).float()
        return cls(
            codec_pad=talker["tts_codec_pad_token_id"],
            codec_bos=talker["tts_codec_start_token_id"],
            codec_eos=talker["tts_codec_end_token_id"],
            codec_mask=talker["tts_codec_mask_token_id"],
            vocab_size=talker["vocab_size"],
            voices={name: rows[i] for i, name in enumerate(names)},
            text_eos=rows[-2],
            text_pad=rows[-1],
            header=assistant_header(folder),
        )


def assistant_header(folder: Path) -> tuple[int, ...]:
    """The token ids of `<|im_start|>assistant\n` in the checkpoint's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tuple(tokenizer("<|im_start|>assistant\n", add_special_tokens=False).input_ids)


@dataclass(frozen=True)
class TalkerPrompt:
    ids: list[int]  # the talker's prompt token ids (codec mask, pad, start)
    rows: torch.Tensor  # conditioning, one row per position (see talker_input)
    codec_from: int  # positions before it leave out the codec embedding
    positions: torch.Tensor | None  # [3, thinker prompt] M-RoPE positions, where not 1-D


def talker_input(
    states: torch.Tensor,
    num_prompt: int,
    specials: TalkerSpecials,
    voice: str,
    finished: bool = True,
) -> TalkerPrompt:
    """The talker's prompt as transformers builds it: prompt rows (thinker hidden + embedding,
    no codec term), the voice's start embedding with the codec pad, the first reply token with
    the codec start; then, one per generated code, the remaining reply tokens, the text-end and
    text-pad embeddings (the last repeats). With `finished` False (the thinker is still writing)
    the rows end at its newest token. `states` rows are [hidden | embedding], followed by the
    token's 3 M-RoPE positions when the thinker has them (vllm_omni.worker.hidden_states); the
    prompt's positions are kept only where they differ from plain 1-D ones (images, video)."""
    width = specials.text_eos.shape[-1]  # the thinker's hidden size
    states = states.float()
    thinker = states[:, :width] + states[:, width : 2 * width]  # hidden + token embedding
    positions = None
    if states.shape[1] > 2 * width:
        positions = states[:num_prompt, 2 * width :].T.round().long()
        if torch.equal(positions, torch.arange(num_prompt).expand_as(positions)):
            positions = None  # a text or audio prompt: 1-D positions say the same
    prompt, reply = thinker[:num_prompt], thinker[num_prompt:]
    ends = [specials.text_eos[None], specials.text_pad[None]] if finished else []
    rows = torch.cat([prompt, specials.voices[voice][None], reply, *ends])
    ids = [specials.codec_mask] * num_prompt + [specials.codec_pad, specials.codec_bos]
    return TalkerPrompt(ids, rows, num_prompt, positions)


def speakable_codes(rows: torch.Tensor, num_prompt: int, finished: bool) -> float:
    """How many codes the talker can generate from these conditioning rows: code k reads row
    num_prompt + 1 + k; once the thinker has finished, the last row repeats for ever."""
    return float("inf") if finished else rows.shape[0] - num_prompt - 1


@dataclass
class TalkerGenerator(Generator):
    """Speaks while the thinker writes: with `stream_input` the talker generates in segments,
    each a vLLM request that continues the previous one (its prompt is the codes so far, found
    in the prefix cache under the request's own `cache_salt`), as far as the thinker's newest
    hidden state allows; greedy decoding gives the same codes as one request.

    Seeded sampling draws anew in every segment (a vLLM request seeds its own generator), so
    its segments must not depend on the thinker's pace: they have fixed lengths (min_segment,
    doubling each time), each seeded from the request's seed and its index, streamed or not.
    Same seed, same codes, streamed or not."""

    takes_user_params = False
    request_options = ("voice",)
    model: str
    """The Qwen2.5-Omni folder: its special tokens, voices and thinker embeddings are read on
    first use (so that building the processor reads no weights: the memory plan does)."""
    min_segment: int = 16  # codes: fewer and a segment's prefill would cost more than it speaks

    @classmethod
    def for_stage(cls, config) -> TalkerGenerator:
        return cls(config.model)

    @functools.cached_property
    def specials(self) -> TalkerSpecials:
        return TalkerSpecials.load(self.model)

    def engine_defaults(self) -> dict[str, Any]:
        from vllm_omni.models.qwen2_5_omni.talker_model import talker_hf_overrides
        from vllm_omni.worker.hooks import with_worker_hooks

        args = {
            "hf_overrides": talker_hf_overrides,
            "skip_tokenizer_init": True,
            "generation_config": "vllm",
            "async_scheduling": False,
            "enforce_eager": True,  # conditioning is set per step (see .talker_worker)
        }
        return with_worker_hooks(args, TALKER_HOOK)

    def default_params(self):
        from vllm import SamplingParams

        return SamplingParams(max_tokens=TALKER_MAX_TOKENS, **TALKER_SAMPLING)

    def check_options(self, inputs) -> None:
        self.voice(inputs.get("voice"))  # an unknown voice fails here, by name

    def voice(self, requested: str | None) -> str:
        voices = sorted(self.specials.voices)
        if requested is None:
            return DEFAULT_VOICE if DEFAULT_VOICE in voices else voices[0]
        if requested not in voices:
            raise FieldError("voice", f"unknown voice {requested!r}; known: {voices}")
        return requested

    async def run(
        self, stage, request_id: str, inputs: dict[str, Any], params, emit=None
    ) -> dict[str, Any]:
        voice = self.voice(inputs.get("voice"))
        upstream = inputs.get("upstream")
        if upstream is None:  # the thinker has finished: everything at once
            upstream = finished_thinker(inputs)
        budget = params.max_tokens or TALKER_MAX_TOKENS
        seeded = draws_from_seed(params)
        pieces: list[torch.Tensor] = []
        num_prompt, finished, codes, segment = None, False, [], 0
        feed = upstream.__aiter__()
        while True:
            size = self.min_segment * 2**segment if seeded else self.min_segment
            if not finished and (num_prompt is None or self._wait(pieces, num_prompt, codes, size)):
                outputs, finished = await feed.__anext__()
                if outputs.get("prompt_token_ids"):
                    num_prompt = self.specials.reply_start(list(outputs["prompt_token_ids"]))
                if finished:
                    pieces = (
                        [outputs["thinker_states"]]
                        if outputs.get("thinker_states") is not None
                        else []
                    )
                elif outputs.get("thinker_states") is not None:
                    pieces.append(outputs["thinker_states"])
                continue
            states = torch.cat(pieces) if pieces else None
            if states is None or states.shape[0] < num_prompt + 1:
                break  # no reply to speak
            prompt = await asyncio.to_thread(
                talker_input, states, num_prompt, self.specials, voice, finished
            )
            want = min(speakable_codes(prompt.rows, num_prompt, finished), budget) - len(codes)
            if seeded:
                want = min(want, size)
            if want <= 0:
                break
            new, stopped = await self._segment(
                stage, request_id, segment, prompt, codes, params, int(want), emit
            )
            segment += 1
            codes += new
            if stopped or len(codes) >= budget or (finished and not new):
                break
        return {"codec_tokens": torch.tensor(codes, dtype=torch.long)}

    def _wait(
        self, pieces: list[torch.Tensor], num_prompt: int, codes: list[int], size: int
    ) -> bool:
        """Whether to wait for more thinker states before a segment of `size` codes."""
        rows = sum(p.shape[0] for p in pieces) + 1  # + the voice row
        return rows - num_prompt - 1 - len(codes) < size

    async def _segment(
        self, stage, request_id, segment, talker_prompt, spoken, params, max_tokens, emit
    ) -> tuple[list[int], bool]:
        """Segment number `segment` of a request: one talker request continuing the codes
        already `spoken`; (new codes, stopped at an end). `emit` hears the codes as they are
        generated."""
        from vllm import TokensPrompt

        from vllm_omni.models.qwen2_5_omni.talker_worker import PAYLOAD_KEY, encode_payload

        s = self.specials
        params = params.clone()
        params.max_tokens = max_tokens
        if draws_from_seed(params):  # its own draws, the same whenever this segment runs
            params.seed = segment_seed(params.seed, segment)
        payload = encode_payload(
            talker_prompt.rows, talker_prompt.codec_from, talker_prompt.positions
        )
        params.extra_args = {**(params.extra_args or {}), PAYLOAD_KEY: payload}
        if not params.stop_token_ids:
            params.stop_token_ids = [s.codec_pad, s.codec_eos]
        if params.allowed_token_ids is None:  # transformers suppresses the codec start token
            params.allowed_token_ids = [i for i in range(s.vocab_size) if i != s.codec_bos]
        # The salt keeps this request's cached blocks to itself: every talker prompt starts
        # with the same codes, but the conditioning differs.
        prompt = TokensPrompt(prompt_token_ids=talker_prompt.ids + spoken, cache_salt=request_id)
        codes: list[int] = []
        async for out in stage.engine.generate(prompt, params, f"{request_id}#{segment}"):
            fresh = list(out.outputs[0].token_ids)[len(codes) :]
            ends = [i for i, c in enumerate(fresh) if c in params.stop_token_ids]
            fresh = fresh[: ends[0]] if ends else fresh
            codes += fresh
            if emit is not None and fresh:
                emit({"codec_tokens": torch.tensor(fresh, dtype=torch.long)})
            if ends:
                return codes, True
        return codes, False
