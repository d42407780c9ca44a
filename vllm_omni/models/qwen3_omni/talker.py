# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni's talker stage (processor `qwen3_omni_talker`): speech-codec frames from the
thinker's rows.

Builds the talker's input as transformers does (`.talker_prompt`) once the thinker has finished,
and runs it as one request on the project's talker model (`.talker_model`, its per-step inputs
set by the `qwen3_omni_talker` worker hook). vLLM samples each frame's first code; the frame's
other codes come back with the next step (`.talker_worker`), so a frame is complete one step
after its first code. Complete frames are emitted as they come (`codec_tokens` [G, frames]) for
code2wav to decode while the talker speaks; the output holds all of them, up to the end code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_omni.engine.ar_processor import Generator
from vllm_omni.models.qwen3_omni.talker_prompt import TalkerSpecials, talker_prompt
from vllm_omni.models.talker_common import draws_from_seed, finished_thinker, segment_seed

TALKER_HOOK = "qwen3_omni_talker"
DEFAULT_VOICE = "Ethan"  # transformers' generate default
TALKER_MAX_TOKENS = 4096
# transformers' talker sampling defaults (Qwen3OmniMoeForConditionalGeneration.generate).
TALKER_SAMPLING = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)


@dataclass
class Qwen3TalkerGenerator(Generator):
    takes_user_params = False
    hands_on_hidden_states = True  # the frames' residual codes come back through the tap
    request_options = ("voice",)
    model: str
    """The Qwen3-Omni folder: its special ids and tts embeddings are read on first use."""
    min_segment: int = 16  # frames: fewer and a segment's prefill would cost more than it speaks

    @classmethod
    def for_stage(cls, config) -> Qwen3TalkerGenerator:
        return cls(config.model)

    @functools.cached_property
    def specials(self) -> TalkerSpecials:
        return TalkerSpecials.load(self.model)

    def engine_defaults(self) -> dict[str, Any]:
        from vllm_omni.models.qwen3_omni.talker_model import talker_hf_overrides
        from vllm_omni.worker.hooks import with_worker_hooks

        args = {
            "hf_overrides": talker_hf_overrides,
            "skip_tokenizer_init": True,
            "generation_config": "vllm",
            "async_scheduling": False,
            "enforce_eager": True,  # each step's inputs are set per step (see .talker_worker)
            # A continuing segment finds its prompt's blocks cached (under its request's salt).
            "enable_prefix_caching": True,
        }
        return with_worker_hooks(args, TALKER_HOOK)

    def default_params(self):
        from vllm import SamplingParams

        return SamplingParams(max_tokens=TALKER_MAX_TOKENS, **TALKER_SAMPLING)

    def check_options(self, inputs) -> None:
        self.voice(inputs.get("voice"))

    def voice(self, requested: str | None) -> str:
        if requested is None:
            return DEFAULT_VOICE
        self.specials.speaker(requested)  # an unknown voice fails here, by name
        return requested

    async def run(
        self, stage, request_id: str, inputs: dict[str, Any], params, emit=None
    ) -> dict[str, Any]:
        voice = self.voice(inputs.get("voice"))
        upstream = inputs.get("upstream") or finished_thinker(inputs)
        budget = params.max_tokens or TALKER_MAX_TOKENS
        seeded = draws_from_seed(params)
        feed = upstream.__aiter__()
        pieces: list[torch.Tensor] = []
        prompt_ids: list[int] = []
        finished, segment = False, 0
        spoken = _Spoken(self.specials.num_code_groups)
        # transformers feeds back every first code it samples but the last: at most
        # `max_tokens - 1` complete frames. A segment that samples n + 1 first codes completes
        # n frames (sampling a frame's first code reads the row before it; the last one drawn
        # is drawn anew by the next segment).
        limit = budget - 1
        while spoken.frames < limit and not spoken.ended:
            size = self.min_segment * 2**segment
            prompt = None
            if pieces:
                states = torch.cat(pieces)
                prompt = talker_prompt(states, prompt_ids, self.specials, voice, finished)
            room = limit - spoken.frames
            if prompt is not None and not finished:  # frames whose rows have come
                room = min(room, prompt.rows.shape[0] - len(prompt.ids) - spoken.frames)
            frames = min(room, size) if seeded else room
            full = frames == size if seeded else frames >= self.min_segment
            if not finished and (prompt is None or not full):
                outputs, finished = await feed.__anext__()
                prompt_ids = list(outputs.get("prompt_token_ids") or prompt_ids)
                states = outputs.get("thinker_states")
                if finished:
                    pieces = [] if states is None else [states]
                elif states is not None:
                    pieces.append(states)
                continue
            if prompt is None or frames <= 0:
                break  # nothing (more) to speak
            await self._segment(
                stage, request_id, segment, prompt, spoken, params, frames + 1, emit
            )
            segment += 1
        return {"codec_tokens": spoken.codes()}

    async def _segment(self, stage, request_id, segment, prompt, spoken, params, codes, emit):
        """Segment number `segment` of a request: one talker request that continues the frames
        already `spoken` and samples at most `codes` first codes."""
        from vllm import TokensPrompt

        from vllm_omni.models.qwen3_omni.talker_worker import PAYLOAD_KEY, encode_payload

        s = self.specials
        params = params.clone()
        params.max_tokens = codes
        if draws_from_seed(params):  # its own draws, the same whenever this segment runs
            params.seed = segment_seed(params.seed, segment)
        known = spoken.residuals()
        payload = encode_payload(
            prompt.rows, prompt.hidden, prompt.codec_from, len(prompt.ids), known, prompt.positions
        )
        params.extra_args = {**(params.extra_args or {}), PAYLOAD_KEY: payload}
        params.stop_token_ids = [s.codec_eos]
        # transformers suppresses the codec's special ids but the end code
        params.allowed_token_ids = [*range(s.codebook_size), s.codec_eos]
        # The salt keeps a request's cached blocks to itself: every talker prompt starts with
        # the same ids, but the thinker rows differ.
        ids = prompt.ids + spoken.firsts
        spoken.segment_start = spoken.frames
        request = TokensPrompt(prompt_token_ids=ids, cache_salt=request_id)
        segment_id = f"{request_id}#{segment}"
        firsts: list[int] = []
        async for out in stage.engine.generate(request, params, segment_id):
            firsts = list(out.outputs[0].token_ids)
            rows = stage.hidden_states.take(segment_id)
            new = spoken.extend(firsts, rows)
            if emit is not None and new is not None:
                emit({"codec_tokens": new})
        spoken.ended = s.codec_eos in firsts


@dataclass
class _Spoken:
    """A request's complete frames so far: their first codes and residual codes."""

    groups: int
    firsts: list[int] = field(default_factory=list)
    rest: list[torch.Tensor] = field(default_factory=list)  # [k, G - 1] pieces
    ended: bool = False  # the talker sampled its end code
    segment_start: int = 0  # frames complete when the current segment began

    @property
    def frames(self) -> int:
        return len(self.firsts)

    def residuals(self) -> torch.Tensor:
        if not self.rest:
            return torch.zeros(0, self.groups - 1, dtype=torch.long)
        return torch.cat(self.rest)

    def extend(self, segment_firsts: list[int], rows: torch.Tensor | None) -> torch.Tensor | None:
        """The current segment's first codes so far and its new residual rows (frames in
        order): the newly complete frames, [G, k], or None."""
        if rows is None:
            return None
        at = self.frames - self.segment_start
        firsts = segment_firsts[at : at + rows.shape[0]]
        self.firsts += firsts
        self.rest.append(rows.long())
        return torch.cat([torch.tensor(firsts)[:, None], rows.long()], dim=1).T.contiguous()

    def codes(self) -> torch.Tensor:
        first = torch.tensor(self.firsts, dtype=torch.long)[:, None]
        return torch.cat([first, self.residuals()], dim=1).T.contiguous()
