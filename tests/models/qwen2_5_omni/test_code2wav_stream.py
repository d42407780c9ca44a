# SPDX-License-Identifier: Apache-2.0
"""Streaming code2wav's window planning, without a stage process: which windows go out as the
talker's codes arrive, and that the audio leaves in order, each chunk's as soon as it is back."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from vllm_omni.engine.stage_stream import StageStream
from vllm_omni.models.qwen2_5_omni.code2wav import (
    STREAM_CHUNK_CODES,
    STREAM_FIRST_CHUNK_CODES,
    STREAM_LEFT_CODES,
    STREAM_LOOKAHEAD_CODES,
    Code2WavInfo,
    chunk_windows,
)
from vllm_omni.models.qwen2_5_omni.code2wav_stream import stream_code2wav
from vllm_omni.models.qwen2_5_omni.params import Code2WavParams

ALIGN = 12
SAMPLES = 4  # per code, so that a window's audio is easy to check


class FakeStage:
    """Decodes a window into its kept codes' ids, SAMPLES samples each."""

    info = Code2WavInfo(24_000, ("v",), SAMPLES, 4096, ALIGN)

    def __init__(self) -> None:
        self.windows: list[tuple[int, int, int, int]] = []

    async def submit(self, request_id, inputs, params):
        codes = inputs["codec_tokens"]
        start, (keep0, keep1) = params.window_start, params.keep
        self.windows.append((start, start + len(codes), start + keep0, start + keep1))
        await asyncio.sleep(0)
        kept = codes[keep0:keep1].float().repeat_interleave(SAMPLES)
        return np.asarray(kept)


async def _stream(codes: list[int], pieces: int) -> tuple[FakeStage, dict, list[torch.Tensor]]:
    stage, upstream, emitted = FakeStage(), StageStream({"codec_tokens": "codec_tokens"}), []
    step = max(1, -(-len(codes) // pieces))
    for i in range(0, len(codes), step):
        upstream.put({"codec_tokens": torch.tensor(codes[i : i + step])})
    upstream.put({"codec_tokens": torch.tensor(codes)}, final=True)
    out = await stream_code2wav(
        stage, "r", upstream, Code2WavParams(voice="v", seed=1), emitted.append
    )
    return stage, out, emitted


def test_windows_tile_the_codes_as_a_chunked_decode_plans_them() -> None:
    codes = list(range(200))
    stage, out, emitted = asyncio.run(_stream(codes, pieces=7))
    assert stage.windows == chunk_windows(
        len(codes),
        STREAM_CHUNK_CODES,
        STREAM_LEFT_CODES,
        STREAM_LOOKAHEAD_CODES,
        ALIGN,
        first=STREAM_FIRST_CHUNK_CODES,
    )
    # The joined chunks are the whole request's audio, in order; each chunk left on its own.
    expected = torch.tensor(codes, dtype=torch.float32).repeat_interleave(SAMPLES)
    assert torch.equal(out["audio"], expected)
    assert torch.equal(torch.cat([e["audio"] for e in emitted]), expected)
    assert len(emitted) == len(stage.windows) and out["sample_rate"] == 24_000


def test_a_reply_shorter_than_the_first_chunk_is_one_window() -> None:
    stage, out, _ = asyncio.run(_stream(list(range(5)), pieces=2))
    assert stage.windows == [(0, 5, 0, 5)]
    assert len(out["audio"]) == 5 * SAMPLES


def test_no_codes_no_audio() -> None:
    stage, out, emitted = asyncio.run(_stream([], pieces=1))
    assert stage.windows == [] and emitted == [] and len(out["audio"]) == 0
