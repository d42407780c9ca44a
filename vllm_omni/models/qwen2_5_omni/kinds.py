# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-Omni's process-stage executor, as registered: `code2wav` (speech codes -> waveform)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vllm_omni.diffusion.executor_kind import Emit, ExecutorKind, StageInfo, as_tensor
from vllm_omni.diffusion.params import stage_params
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen2_5_omni.params import Code2WavParams


class Code2WavKind(ExecutorKind):
    name = "code2wav"
    params_type = Code2WavParams
    whole_requests = True
    request_options = ("voice",)
    streams = True
    # One thread: vLLM binds the thinker's and talker's workers to the cores it does not
    # reserve, so a second decoding thread lands on a busy worker core and every OpenMP barrier
    # waits for it (2-core EPYC, streamed request alone: first audio 0.95-7.7 s on 2 threads,
    # 0.74-1.13 s on 1; the whole reply 6.8-11 s vs 4.6-6.2 s). One request per batch: batching
    # decodes saves little on a CPU (one thread, 512 codes: 0.96 s alone, 0.74 s each in a batch
    # of 2, 0.93 s in a batch of 4), and a request's audio would wait for its whole batch.
    cpu_defaults = {"num_threads": 1, "max_num_seqs": 1}

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.qwen2_5_omni.code2wav import Code2WavExecutor

        if pipe is not None:
            raise FieldError("pipe", "the code2wav executor loads its own model")
        return Code2WavExecutor(config, cache)

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        voice = inputs.get("voice")
        return params if voice is None else replace(params or Code2WavParams(), voice=voice)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Code2WavParams:
        params = stage_params(params, Code2WavParams, stage, "a code2wav")
        if params.voice not in info.voices:
            raise FieldError("voice", f"unknown voice {params.voice!r}; known: {list(info.voices)}")
        if params.seed is None:
            params = replace(params, seed=random.randrange(2**63))
        return params

    def outputs(self, result: Any, info: StageInfo) -> dict[str, Any]:
        return {"audio": as_tensor(result), "sample_rate": info.sample_rate}

    async def stream(
        self, stage: Any, request_id: str, upstream: Any, params: Any, emit: Emit | None
    ) -> dict[str, Any]:
        from vllm_omni.models.qwen2_5_omni.code2wav_stream import stream_code2wav

        return await stream_code2wav(stage, request_id, upstream, params, emit)
