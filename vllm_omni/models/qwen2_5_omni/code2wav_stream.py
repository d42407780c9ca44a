# SPDX-License-Identifier: Apache-2.0
"""Streaming code2wav: audio in bounded chunks while the talker is still speaking.

The talker's codes arrive in pieces (`StageStream`). Whenever a chunk of `chunk` new codes plus
`lookahead` codes after it are known (or the talker has finished), one window goes to the DiT
process (the first chunk is shorter, see STREAM_FIRST_CHUNK_CODES): the chunk, up to `left`
codes of left context before it (aligned down to the DiT's attention blocks) and the
look-ahead. The process decodes the window with the request's own noise frames and returns the
audio of the chunk only (Code2WavParams.window_start / keep), so the joined chunks approximate
the whole-request decode (boundary error measured in tests/models/qwen2_5_omni/test_code2wav.py).
Chunks leave in order, each as soon as it is decoded.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import torch

from vllm_omni.diffusion.executor_kind import as_tensor
from vllm_omni.models.qwen2_5_omni.code2wav import (
    STREAM_CHUNK_CODES,
    STREAM_FIRST_CHUNK_CODES,
    STREAM_LEFT_CODES,
    STREAM_LOOKAHEAD_CODES,
)


def chunk_size(kept: int) -> int:
    return STREAM_FIRST_CHUNK_CODES if kept == 0 else STREAM_CHUNK_CODES


async def stream_code2wav(stage, request_id: str, upstream, params, emit) -> dict[str, Any]:
    align = stage.info.window_align
    rate = stage.info.sample_rate
    codes: list[int] = []
    kept = 0  # codes whose audio is decided (submitted)
    jobs: list[asyncio.Task] = []
    pieces: list[torch.Tensor] = []
    sent = 0

    def submit(keep_end: int) -> None:
        nonlocal kept
        start = (max(0, kept - STREAM_LEFT_CODES) // align) * align
        end = min(len(codes), keep_end + STREAM_LOOKAHEAD_CODES)
        window = torch.tensor(codes[start:end], dtype=torch.long)
        p = replace(params, window_start=start, keep=(kept - start, keep_end - start))
        job = stage.submit(f"{request_id}#{len(jobs)}", {"codec_tokens": window}, p)
        jobs.append(asyncio.ensure_future(job))
        kept = keep_end

    async def deliver(block: bool) -> None:
        nonlocal sent
        while sent < len(jobs) and (block or jobs[sent].done()):
            audio = as_tensor(await jobs[sent])
            pieces.append(audio)
            sent += 1
            if emit is not None and len(audio):
                emit({"audio": audio, "sample_rate": rate})

    try:
        async for outputs, final in upstream:
            if not final and "codec_tokens" in outputs:
                codes += outputs["codec_tokens"].tolist()
            if final:
                codes = outputs["codec_tokens"].tolist()  # the whole, cut at the end code
            while len(codes) - kept >= (chunk := chunk_size(kept)) + (
                0 if final else STREAM_LOOKAHEAD_CODES
            ):
                submit(kept + chunk)
            if final and len(codes) > kept:
                submit(len(codes))
            await deliver(block=False)
        await deliver(block=True)
    finally:
        for job in jobs:
            job.cancel()
    audio = torch.cat(pieces) if pieces else torch.zeros(0)
    return {"audio": audio, "sample_rate": rate}
