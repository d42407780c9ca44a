# SPDX-License-Identifier: Apache-2.0
"""Code2WavExecutor: Qwen2.5-Omni's third stage (speech-codec tokens -> 24 kHz waveform).

Runs transformers' own `Qwen2_5OmniToken2WavModel` (flow-matching DiT + BigVGAN) in the DiT
stage's process, loaded alone from the full Qwen2.5-Omni folder: the thinker and talker
weights are never read. Each request decodes by itself, as HF's `generate` does, so that a
request's waveform depends only on its codes, voice and seed - never on what it shared a
step with. The only randomness is the DiT's initial noise, drawn from torch's global RNG
inside `sample()`; seeding that RNG per request (in a forked RNG state) makes a waveform
equal HF's `torch.manual_seed(seed)` followed by the same token2wav call.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.params import Code2WavParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

CODEC_TOKENS = "codec_tokens"
SAMPLE_RATE = 24_000  # Qwen2.5-Omni's BigVGAN output rate (model card); not in the config
WEIGHT_PREFIX = "token2wav."
SPEAKER_FILE = "spk_dict.pt"


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
        raise ValueError(f"model: no *.safetensors in {str(folder)!r}")
    state = {}
    for file in files:
        # Only the token2wav tensors are read: a real checkpoint's thinker is ~7B parameters.
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                if name.startswith(WEIGHT_PREFIX):
                    state[name[len(WEIGHT_PREFIX) :]] = f.get_tensor(name)
    if not state:
        raise ValueError(f"model: no '{WEIGHT_PREFIX}*' weights in {str(folder)!r}")
    model = Qwen2_5OmniToken2WavModel(config)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=torch.float32).eval()


def load_voices(folder: str | Path) -> dict[str, dict[str, object]]:
    path = Path(folder) / SPEAKER_FILE
    if not path.is_file():
        raise ValueError(f"model: {str(path)!r} is missing (Qwen2.5-Omni's voices)")
    voices = torch.load(path, weights_only=True)
    for name, voice in voices.items():
        for key in ("cond", "ref_mel"):
            if key not in voice:
                raise ValueError(f"{SPEAKER_FILE}: voice {name!r} has no {key!r}")
    return voices


class Code2WavExecutor:
    """Whole requests only (`fifo` scheduling); see the module docstring."""

    def __init__(self, config: DiTConfig, cache: DiTCacheManager) -> None:
        # Imported here: executor.py imports this module for its registry of executors.
        from vllm_omni.diffusion.executor import resolve_device

        if config.dtype not in ("auto", "float32"):
            raise ValueError(
                f"dtype: the code2wav executor runs in float32 (as transformers' token2wav "
                f"does), got {config.dtype!r}"
            )
        self.config = config
        self.cache = cache
        self.device = resolve_device(config.device)
        start = time.perf_counter()
        self.model = load_token2wav(config.model, self.device)
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
        self.hop = math.prod(self.model.config.bigvgan_config.upsample_rates)
        self.max_codec_tokens = dit.max_position_embeddings // dit.repeats
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
    def info(self) -> dict:
        return {
            "sample_rate": SAMPLE_RATE,
            "voices": sorted(self.voices),
            "samples_per_token": self.samples_per_token,
            "max_codec_tokens": self.max_codec_tokens,
        }

    def check_request(self, request: DiTRequest) -> None:
        """Reject at admission what would fail mid-step (and fail the step's other requests)."""
        p = request.params
        if not isinstance(p, Code2WavParams):
            raise ValueError(
                f"sampling_params: the code2wav stage takes Code2WavParams, got {type(p).__name__}"
            )
        if p.voice not in self.voices:
            raise ValueError(f"voice: unknown voice {p.voice!r}; known: {sorted(self.voices)}")
        codes = request.inputs.get(CODEC_TOKENS)
        if codes is None:
            raise ValueError(f"inputs: the code2wav stage needs {CODEC_TOKENS!r}")
        if codes.dim() != 1 or codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise ValueError(
                f"{CODEC_TOKENS}: must be a 1-D integer tensor, got {codes.dtype} "
                f"of shape {tuple(codes.shape)}"
            )
        if codes.numel() > self.max_codec_tokens:
            raise ValueError(
                f"{CODEC_TOKENS}: at most {self.max_codec_tokens} tokens, got {codes.numel()}"
            )
        if codes.numel() and not (0 <= int(codes.min()) and int(codes.max()) < self.num_codes):
            raise ValueError(
                f"{CODEC_TOKENS}: ids must be in [0, {self.num_codes}), got "
                f"[{int(codes.min())}, {int(codes.max())}] (cut the codes at the first eos)"
            )

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
            for request_id in group:
                start = time.perf_counter()
                out.finished[request_id] = self.decode(requests[request_id])
                out.step_seconds.append(time.perf_counter() - start)
        return out

    @torch.inference_mode()
    def decode(self, request: DiTRequest) -> torch.Tensor:
        """One request's waveform: 1-D float32 on the CPU."""
        p = request.params
        codes = request.inputs[CODEC_TOKENS].to(self.device, torch.long)
        if codes.numel() == 0:
            return torch.zeros(0, dtype=torch.float32)
        voice = self.voices[p.voice]
        with _seeded(p.seed, self.device):
            wav = self.model(
                codes[None],
                conditioning=voice["cond"],
                reference_mel=voice["ref_mel"],
                num_steps=p.num_steps,
                guidance_scale=p.guidance_scale,
                sway_coefficient=p.sway_coefficient,
            )
        return wav.reshape(-1).float().cpu()


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seeds torch's global RNG for one decode and restores it after, so that a request's
    noise depends on its seed alone. Seed None: the noise continues the process's RNG."""
    if seed is None:
        yield
        return
    # The DiT draws its noise on the codes' device: fork that device's RNG too.
    devices = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed)  # what HF's reference does: seeds every device's generator
        yield
