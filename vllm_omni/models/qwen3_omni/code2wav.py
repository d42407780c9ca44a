# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni's code2wav stage (executor `qwen3_code2wav`): speech-codec frames -> 24 kHz
waveform, in its own process.

The model is transformers' `Qwen3OmniMoeCode2Wav` with the checkpoint's `code2wav.*` weights, in
float32: a causal ConvNet after a sliding-window transformer, 1920 samples per frame. A whole
request decodes as transformers' `generate` does (`chunked_decode`: chunks of 300 frames, each
with 25 frames of left context). A streamed request (`stream`) decodes chunks of frames as the
talker speaks them, each with up to `STREAM_LEFT_FRAMES` frames of left context and no
look-ahead: the model is causal, so a chunk's audio needs no later frames. Each window's
`left_context` frames give context only; their samples are cut off, less the samples every
decode leaves off its end, so that the joined chunks are as long as one whole decode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from vllm_omni.diffusion.executor_kind import Emit, ExecutorKind, StageInfo, as_tensor
from vllm_omni.diffusion.params import is_int, params_from_dict, stage_params
from vllm_omni.errors import FieldError
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

SAMPLE_RATE = 24_000
CODEC_TOKENS = "codec_tokens"
WEIGHT_PREFIX = "code2wav."
WHOLE_CHUNK_FRAMES, WHOLE_LEFT_FRAMES = 300, 25  # transformers' generate
STREAM_FIRST_FRAMES, STREAM_CHUNK_FRAMES = 4, 25  # 0.32 s first, then 2 s a chunk
STREAM_LEFT_FRAMES = 25


@dataclass(frozen=True)
class Qwen3Code2WavParams:
    """`left_context`: the first frames of the request's codes give context only (a streamed
    window); their audio is cut off. 0 decodes whole codes as transformers does."""

    left_context: int = 0
    seed: int | None = None  # unused: the decoder draws nothing
    deadline = None

    def __post_init__(self) -> None:
        if not is_int(self.left_context) or self.left_context < 0:
            raise FieldError("left_context", f"must be an integer >= 0, got {self.left_context!r}")

    @property
    def total_steps(self) -> int:
        return 1

    @property
    def rows(self) -> int:
        return 1

    def step_key(self, inputs: Mapping[str, Any]) -> Hashable:
        return self.call_key(inputs)

    def call_key(self, inputs: Mapping[str, Any]) -> Hashable:
        codes = inputs.get(CODEC_TOKENS)  # the executor decodes one request a call anyway
        return (-1 if codes is None else codes.shape[-1], self.left_context)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen3Code2WavParams:
        return params_from_dict(cls, values, "qwen3_code2wav")


@dataclass(frozen=True)
class Qwen3Code2WavInfo(StageInfo):
    sample_rate: int
    samples_per_frame: int
    num_code_groups: int
    codebook_size: int


def load_code2wav(folder: str | Path, device: torch.device):
    """transformers' Qwen3-Omni code2wav with only the `code2wav.*` weights of `folder`."""
    from safetensors import safe_open
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    folder = Path(folder)
    config = Qwen3OmniMoeConfig.from_pretrained(folder).code2wav_config
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:  # the other stages' tensors stay unread
            for name in f.keys():
                if name.startswith(WEIGHT_PREFIX):
                    state[name[len(WEIGHT_PREFIX) :]] = f.get_tensor(name)
    if not state:
        raise FieldError("model", f"no '{WEIGHT_PREFIX}*' weights in {str(folder)!r}")
    model = Qwen3OmniMoeCode2Wav(config)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=torch.float32).eval()


class Qwen3Code2WavExecutor:
    """Whole requests only (`fifo` scheduling), one request a call."""

    def __init__(self, config, cache) -> None:
        from vllm_omni.diffusion.config import resolve_device

        self.cache = cache
        self.device = resolve_device(config.device)
        start = time.perf_counter()
        self.model = load_code2wav(config.model, self.device)
        c = self.model.config
        self._info = Qwen3Code2WavInfo(
            sample_rate=SAMPLE_RATE,
            samples_per_frame=int(self.model.total_upsample),
            num_code_groups=c.num_quantizers,
            codebook_size=c.codebook_size,
        )
        logger.info(
            "code2wav stage: loaded %s on %s in %.1f s",
            config.model,
            self.device,
            time.perf_counter() - start,
        )

    @property
    def info(self) -> Qwen3Code2WavInfo:
        return self._info

    def stats(self) -> dict[str, int]:
        return {}

    def check_request(self, request) -> None:
        codes = request.inputs.get(CODEC_TOKENS)
        info = self._info
        if codes is None:
            raise FieldError("inputs", f"the code2wav stage needs {CODEC_TOKENS!r}")
        if codes.dim() != 2 or codes.shape[0] != info.num_code_groups:
            raise FieldError(
                CODEC_TOKENS,
                f"must be [{info.num_code_groups}, frames], got {tuple(codes.shape)}",
            )
        if codes.numel() and not (0 <= int(codes.min()) and int(codes.max()) < info.codebook_size):
            raise FieldError(CODEC_TOKENS, f"codes must be in [0, {info.codebook_size})")
        if request.params.left_context > codes.shape[1]:
            raise FieldError("left_context", f"more than the {codes.shape[1]} frames given")

    def estimate_bytes(self, request) -> int:
        codes = request.inputs.get(CODEC_TOKENS)
        frames = 0 if codes is None else codes.shape[-1]
        return frames * 4 * self._info.samples_per_frame

    def execute_model(self, scheduled, requests):
        from vllm_omni.diffusion.scheduler import DiTRunnerOutput

        out = DiTRunnerOutput()
        for request_id in scheduled.new_request_ids:
            self.cache.allocate(request_id, requests[request_id].inputs)
        for group in scheduled.groups:
            start = time.perf_counter()
            for request_id in group:
                out.finished[request_id] = self.decode(requests[request_id])
            out.step_seconds.append(time.perf_counter() - start)
        return out

    @torch.inference_mode()
    def decode(self, request) -> torch.Tensor:
        codes = request.inputs[CODEC_TOKENS].to(self.device, torch.long)[None]
        if codes.shape[-1] == 0:
            return torch.zeros(0)
        context = request.params.left_context
        if context:
            # A decode ends `lost` samples short of its frames (the causal transposed
            # convolutions drop them): the previous window's audio ended that early, so this
            # one starts there, and the joined windows are as long as one whole decode.
            wav = self.model(codes)
            lost = codes.shape[-1] * self._info.samples_per_frame - wav.shape[-1]
            wav = wav[..., context * self._info.samples_per_frame - lost :]
        else:
            wav = self.model.chunked_decode(codes, WHOLE_CHUNK_FRAMES, WHOLE_LEFT_FRAMES)
        return wav.reshape(-1).float().cpu()


class Qwen3Code2WavKind(ExecutorKind):
    name = "qwen3_code2wav"
    params_type = Qwen3Code2WavParams
    whole_requests = True
    streams = True
    cpu_defaults = {"num_threads": 1, "max_num_seqs": 1}  # as Qwen2.5-Omni's code2wav

    def build(self, config, cache, pipe: Any = None):
        if pipe is not None:
            raise FieldError("pipe", "the code2wav executor loads its own model")
        return Qwen3Code2WavExecutor(config, cache)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        return stage_params(params, Qwen3Code2WavParams, stage, "a Qwen3-Omni code2wav")

    def outputs(self, result: Any, info: StageInfo) -> dict[str, Any]:
        return {"audio": as_tensor(result), "sample_rate": info.sample_rate}

    async def stream(
        self, stage: Any, request_id: str, upstream: Any, params: Any, emit: Emit | None
    ) -> dict[str, Any]:
        return await stream_code2wav(stage, request_id, upstream, params, emit)


async def stream_code2wav(stage, request_id: str, upstream, params, emit) -> dict[str, Any]:
    """Decode the talker's frames in chunks as they arrive (see the module docstring); the
    chunks' audio leaves in order, each as soon as it is decoded."""
    rate = stage.info.sample_rate
    frames: list[torch.Tensor] = []  # [G, k] pieces
    total, kept = 0, 0
    jobs: list[asyncio.Future] = []
    pieces: list[torch.Tensor] = []

    def submit(end: int) -> None:
        nonlocal kept
        start = max(0, kept - STREAM_LEFT_FRAMES)
        window = torch.cat(frames, dim=1)[:, start:end]
        p = replace(params or Qwen3Code2WavParams(), left_context=kept - start)
        jobs.append(
            asyncio.ensure_future(
                stage.submit(f"{request_id}#{len(jobs)}", {CODEC_TOKENS: window}, p)
            )
        )
        kept = end

    async def deliver(block: bool) -> None:
        while len(pieces) < len(jobs) and (block or jobs[len(pieces)].done()):
            audio = as_tensor(await jobs[len(pieces)])
            pieces.append(audio)
            if emit is not None and len(audio):
                emit({"audio": audio, "sample_rate": rate})

    try:
        async for outputs, final in upstream:
            codes = outputs.get(CODEC_TOKENS)
            if final:
                frames, total = (
                    ([codes] if codes is not None else []),
                    (0 if codes is None else codes.shape[1]),
                )
            elif codes is not None:
                frames.append(codes)
                total += codes.shape[1]
            while total - kept >= (
                chunk := STREAM_FIRST_FRAMES if kept == 0 else STREAM_CHUNK_FRAMES
            ):
                submit(kept + chunk)
            if final and total > kept:
                submit(total)
            await deliver(block=False)
        await deliver(block=True)
    finally:
        for job in jobs:
            job.cancel()
    audio = torch.cat(pieces) if pieces else torch.zeros(0)
    return {"audio": audio, "sample_rate": rate}
