# SPDX-License-Identifier: Apache-2.0
"""Code2WavExecutor: Qwen2.5-Omni's third stage (speech-codec tokens -> 24 kHz waveform).

Runs transformers' own `Qwen2_5OmniToken2WavModel` (flow-matching DiT + BigVGAN) in the DiT
stage's process, loaded alone from the full Qwen2.5-Omni folder: the thinker and talker
weights are never read. Each request decodes by itself, as HF's `generate` does, so that a
request's waveform depends only on its codes, voice and seed - never on what it shared a
step with.

The only randomness is the DiT's initial noise. Instead of letting `sample()` draw it from
torch's global RNG, `_sample_mel` (the same steps as `sample()`, on the same transformers
modules) takes it as an argument: a request's noise is one CPU draw of
`[1, 2 * max_codec_tokens, mel_dim]` from a generator seeded with its seed, and a decode uses
the frames its codes cover, so a window of the codes (streaming) starts from the very noise the
whole decode gives them. CPU randn fills in order, 16 values at a time (a size that is not a
multiple of 16 redraws its tail), so with 2 * mel_dim = 160 values per code the first 2N frames
equal `torch.manual_seed(seed); torch.randn([1, 2N, mel_dim])`: a whole request equals HF's
`torch.manual_seed(seed)` + token2wav up to float rounding: the DiT attends through
`block_attention` (the same band of blocks, without transformers' dense masks).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig, resolve_device
from vllm_omni.diffusion.executor_kind import StageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.errors import FieldError
from vllm_omni.logger import init_logger
from vllm_omni.models.qwen2_5_omni.block_attention import use_block_band_attention
from vllm_omni.models.qwen2_5_omni.params import Code2WavParams

logger = init_logger(__name__)

CODEC_TOKENS = "codec_tokens"
SAMPLE_RATE = 24_000  # Qwen2.5-Omni's BigVGAN output rate (model card); not in the config
WEIGHT_PREFIX = "token2wav."
SPEAKER_FILE = "spk_dict.pt"

# Streaming defaults, in codec tokens (one token = 2 mel frames = 40 ms of audio): each window
# decodes a chunk plus left context and look-ahead and keeps the chunk's audio. The DiT only sees
# its window, so the context must span enough attention blocks (12 codes each in Qwen2.5-Omni):
# on the tiny model, 3 blocks each side keep the joined audio within ~1e-3 of the whole decode's
# peak, 2 blocks give ~1e-1 (tests/models/qwen2_5_omni/test_code2wav.py,
# test_chunked_decode_boundary_error).
# Cost: ~2.7x the codes of one whole decode.
STREAM_CHUNK_CODES = 36
STREAM_LEFT_CODES = 36
STREAM_LOOKAHEAD_CODES = 36
# The first chunk starts where the whole decode does, so it has no left context to miss: one
# attention block is enough, and the first audio leaves after 12 + 36 codes instead of 72.
STREAM_FIRST_CHUNK_CODES = 12


@dataclass(frozen=True)
class Code2WavInfo(StageInfo):
    sample_rate: int
    voices: tuple[str, ...]
    samples_per_token: int
    max_codec_tokens: int
    window_align: int
    """A window's `window_start` must be a multiple of it (the DiT's attention block, in codes)."""


def load_token2wav(folder: str | Path, device: torch.device):
    """transformers' Token2Wav model with only the `token2wav.*` weights of `folder`, float32
    (HF forces float32 for this model: the ODE solver drifts in half precision)."""
    from safetensors import safe_open
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniToken2WavModel,
    )

    folder = Path(folder)
    config = Qwen2_5OmniConfig.from_pretrained(folder).token2wav_config
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FieldError("model", f"no *.safetensors in {str(folder)!r}")
    state = {}
    for file in files:
        # Only the token2wav tensors are read: a real checkpoint's thinker is ~7B parameters.
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                if name.startswith(WEIGHT_PREFIX):
                    state[name[len(WEIGHT_PREFIX) :]] = f.get_tensor(name)
    if not state:
        raise FieldError("model", f"no '{WEIGHT_PREFIX}*' weights in {str(folder)!r}")
    model = Qwen2_5OmniToken2WavModel(config)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=torch.float32).eval()


def load_voices(folder: str | Path) -> dict[str, dict[str, object]]:
    path = Path(folder) / SPEAKER_FILE
    if not path.is_file():
        raise FieldError("model", f"{str(path)!r} is missing (Qwen2.5-Omni's voices)")
    voices = torch.load(path, weights_only=True)
    for name, voice in voices.items():
        for key in ("cond", "ref_mel"):
            if key not in voice:
                raise FieldError(SPEAKER_FILE, f"voice {name!r} has no {key!r}")
    return voices


def chunk_windows(
    num_codes: int, chunk: int, left: int, lookahead: int, align: int, first: int | None = None
) -> list[tuple[int, int, int, int]]:
    """Windows for a chunked decode of `num_codes` codes, as absolute code indices
    `(window_start, window_end, keep_start, keep_end)`: the kept ranges are `first` codes (default
    `chunk`), then `chunk` codes each (the last may be shorter), and tile [0, num_codes) in
    order; each window adds up to `left` codes before its kept range, its start aligned down to
    `align` (the DiT's block, in codes), and up to `lookahead` codes after it."""
    first = chunk if first is None else first
    for name, value, low in (
        ("num_codes", num_codes, 0),
        ("chunk", chunk, 1),
        ("left", left, 0),
        ("lookahead", lookahead, 0),
        ("align", align, 1),
        ("first", first, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise FieldError(name, f"must be an integer >= {low}, got {value!r}")
    windows, keep_start = [], 0
    while keep_start < num_codes:
        keep_end = min(num_codes, keep_start + (first if keep_start == 0 else chunk))
        window_start = max(0, keep_start - left) // align * align
        windows.append((window_start, min(num_codes, keep_end + lookahead), keep_start, keep_end))
        keep_start = keep_end
    return windows


def _sample_mel(
    dit,
    conditioning: torch.Tensor,
    reference_mel: torch.Tensor,
    codes: torch.Tensor,
    noise: torch.Tensor,
    num_steps: int,
    guidance_scale: float,
    sway_coefficient: float,
) -> torch.Tensor:
    """`Qwen2_5OmniToken2WavDiTModel.sample` starting from `noise` ([1, frames, mel_dim])
    instead of a global-RNG draw: the same calls in the same order, so the mel is bitwise
    `sample()`'s for the same noise. Returns the mel as [1, mel_dim, frames]."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    frames = codes.shape[1] * dit.repeats
    if noise.shape != (codes.shape[0], frames, dit.mel_dim):
        expected = (codes.shape[0], frames, dit.mel_dim)
        raise FieldError("noise", f"expected shape {expected}, got {noise.shape}")
    conditioning = conditioning.unsqueeze(1).repeat(1, frames, 1)  # one per mel frame
    guided = guidance_scale >= 1e-5  # sample()'s threshold for classifier-free guidance

    def ode_function(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        # apply_cfg=True runs the conditioned and unconditioned passes as one batch of two.
        prediction = dit(
            hidden_states=state,
            speaker_embedding=conditioning,
            condition_vector=reference_mel,
            quantized_code=codes,
            time_step=time_step,
            drop_audio_conditioning=False,
            drop_code=False,
            apply_cfg=guided,
        )
        if not guided:
            return prediction
        conditioned, unconditioned = torch.chunk(prediction, 2, dim=0)
        return conditioned + (conditioned - unconditioned) * guidance_scale

    times = torch.linspace(0, 1, num_steps, device=codes.device, dtype=conditioning.dtype)
    # sample()'s "sway" schedule: more of the steps near t = 0 for a negative coefficient.
    times += sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
    trajectory = RungeKutta4ODESolver(function=ode_function, initial_value=noise).integrate(times)
    return trajectory[-1].permute(0, 2, 1)


class Code2WavExecutor:
    """Whole requests only (`fifo` scheduling); see the module docstring."""

    def __init__(self, config: DiTConfig, cache: DiTCacheManager) -> None:
        if config.dtype not in ("auto", "float32"):
            raise FieldError(
                "dtype",
                f"the code2wav executor runs in float32 (as transformers' token2wav "
                f"does), got {config.dtype!r}",
            )
        self.config = config
        self.cache = cache
        self.device = resolve_device(config.device)
        start = time.perf_counter()
        self.model = load_token2wav(config.model, self.device)
        use_block_band_attention(self.model.code2wav_dit_model)
        self.voices: dict[str, dict[str, torch.Tensor]] = {}
        for name, voice in load_voices(config.model).items():
            # As generate() passes them: float32, cond [1, D], ref_mel [1, T, mel].
            cond, ref_mel = voice["cond"].float(), voice["ref_mel"].float()
            self.voices[name] = {
                "cond": cond.reshape(1, -1).to(self.device),
                "ref_mel": ref_mel.reshape(1, *ref_mel.shape[-2:]).to(self.device),
            }
        dit = self.model.config.dit_config
        self.repeats = dit.repeats  # mel frames per codec token
        self.mel_dim = dit.mel_dim
        self.hop = math.prod(self.model.config.bigvgan_config.upsample_rates)
        self.max_codec_tokens = dit.max_position_embeddings // dit.repeats
        # The DiT's block attention numbers its blocks from frame 0 of its input: a window
        # must start on a block boundary of the whole sequence to see the same blocks.
        if dit.block_size % dit.repeats:
            raise FieldError(
                "block_size",
                f"the DiT's block ({dit.block_size} frames) must hold whole codec "
                f"tokens ({dit.repeats} frames each) for windowed decoding",
            )
        self.window_align = dit.block_size // dit.repeats
        self.num_codes = dit.num_embeds + 1  # the DiT's codec table has num_embeds + 1 rows
        logger.info(
            "code2wav stage: loaded token2wav of %s (voices %s) on %s in %.1f s",
            config.model,
            sorted(self.voices),
            self.device,
            time.perf_counter() - start,
        )

    @property
    def samples_per_token(self) -> int:
        return self.repeats * self.hop

    @property
    def info(self) -> Code2WavInfo:
        return Code2WavInfo(
            sample_rate=SAMPLE_RATE,
            voices=tuple(sorted(self.voices)),
            samples_per_token=self.samples_per_token,
            max_codec_tokens=self.max_codec_tokens,
            window_align=self.window_align,
        )

    def stats(self) -> dict[str, int]:
        return {}

    def check_request(self, request: DiTRequest) -> None:
        """Reject at admission what would fail mid-step (and fail the step's other requests)."""
        p = request.params
        if not isinstance(p, Code2WavParams):
            raise FieldError(
                "sampling_params",
                f"the code2wav stage takes Code2WavParams, got {type(p).__name__}",
            )
        if p.voice not in self.voices:
            raise FieldError("voice", f"unknown voice {p.voice!r}; known: {sorted(self.voices)}")
        codes = request.inputs.get(CODEC_TOKENS)
        if codes is None:
            raise FieldError("inputs", f"the code2wav stage needs {CODEC_TOKENS!r}")
        if codes.dim() != 1 or codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise FieldError(
                f"{CODEC_TOKENS}",
                f"must be a 1-D integer tensor, got {codes.dtype} of shape {tuple(codes.shape)}",
            )
        if codes.numel() > self.max_codec_tokens:
            raise FieldError(
                f"{CODEC_TOKENS}", f"at most {self.max_codec_tokens} tokens, got {codes.numel()}"
            )
        if codes.numel() and not (0 <= int(codes.min()) and int(codes.max()) < self.num_codes):
            raise FieldError(
                f"{CODEC_TOKENS}",
                f"ids must be in [0, {self.num_codes}), got "
                f"[{int(codes.min())}, {int(codes.max())}] (cut the codes at the first eos)",
            )
        self._check_window(p, codes.numel())

    def _check_window(self, p: Code2WavParams, num_codes: int) -> None:
        windowed = p.window_start > 0 or p.keep is not None
        if windowed and p.seed is None:
            # Each window must draw the noise the whole decode would: the same seed.
            raise FieldError("seed", "windowed decoding (window_start / keep) needs a seed")
        if p.window_start % self.window_align:
            raise FieldError(
                "window_start",
                f"must be a multiple of {self.window_align} codes (the DiT's "
                f"attention block), got {p.window_start}",
            )
        if p.window_start + num_codes > self.max_codec_tokens:
            raise FieldError(
                "window_start",
                f"the window [{p.window_start}, {p.window_start + num_codes}) "
                f"ends past the {self.max_codec_tokens} codec tokens a request may have",
            )
        if p.keep is not None and p.keep[1] > num_codes:
            raise FieldError("keep", f"{p.keep} reaches past the window's {num_codes} codes")

    def estimate_bytes(self, request: DiTRequest) -> int:
        codes = request.inputs.get(CODEC_TOKENS)
        n = 0 if codes is None else codes.numel()
        return n * (8 + 4 * self.samples_per_token)  # the codes and the float32 waveform

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        out = DiTRunnerOutput()
        for request_id in scheduled.new_request_ids:  # held while it decodes; aborts free it
            self.cache.allocate(request_id, requests[request_id].inputs)
        for group in scheduled.groups:
            start = time.perf_counter()
            batch = [requests[request_id] for request_id in group]
            out.finished.update(zip(group, self.decode_batch(batch)))
            out.step_seconds.append(time.perf_counter() - start)
        return out

    def noise(self, seed: int | None) -> torch.Tensor:
        """The request's initial noise for every frame it may have, [1, frames, mel_dim] on the
        CPU. Seed None continues the process's RNG (whole decodes only)."""
        shape = [1, self.max_codec_tokens * self.repeats, self.mel_dim]
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=generator)

    def decode(self, request: DiTRequest) -> torch.Tensor:
        """One request's (or window's) waveform: 1-D float32 on the CPU, the kept codes'
        samples only."""
        return self.decode_batch([request])[0]

    @torch.inference_mode()
    def decode_batch(self, requests: list[DiTRequest]) -> list[torch.Tensor]:
        """Waveforms of requests that share a `pipeline_key` (as many codes, the same voice and
        ODE settings), as one batch: each row keeps its own noise, so a request's audio does not
        depend on its batch (up to float rounding of the batched kernels)."""
        p0 = requests[0].params
        codes = torch.stack([r.inputs[CODEC_TOKENS].to(self.device, torch.long) for r in requests])
        if codes.shape[1] == 0:
            return [torch.zeros(0, dtype=torch.float32) for _ in requests]
        voice = self.voices[p0.voice]
        rows = []
        for r in requests:
            self._check_window(r.params, codes.shape[1])
            first = r.params.window_start * self.repeats
            # Drawn on the CPU, also for a CUDA model: the draw then depends on the seed alone,
            # but a CUDA waveform differs from HF's on CUDA, whose sample() draws with the CUDA RNG.
            rows.append(self.noise(r.params.seed)[:, first : first + codes.shape[1] * self.repeats])
        batch = len(requests)
        mel = _sample_mel(
            self.model.code2wav_dit_model,
            voice["cond"].expand(batch, -1),
            voice["ref_mel"].expand(batch, -1, -1),
            codes,
            torch.cat(rows).to(self.device, voice["ref_mel"].dtype),  # sample() draws in its dtype
            num_steps=p0.num_steps,
            guidance_scale=p0.guidance_scale,
            sway_coefficient=p0.sway_coefficient,
        )
        wavs = self.model.code2wav_bigvgan_model(mel).reshape(batch, -1).float().cpu()
        out = []
        for r, wav in zip(requests, wavs):
            if r.params.keep is not None:
                keep = r.params.keep
                wav = wav[keep[0] * self.samples_per_token : keep[1] * self.samples_per_token]
            out.append(wav)
        return out
