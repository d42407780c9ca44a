# SPDX-License-Identifier: Apache-2.0
"""Per-request parameters of a DiT-process stage (image diffusion, code2wav), validated at
construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

OUTPUT_TYPES = ("pil", "latent")


@dataclass(frozen=True)
class DiffusionSamplingParams:
    """What a DiT stage needs to turn prompt embeddings into an image.

    `height`/`width` of None take the pipeline's default size. `seed` of None draws a fresh one
    (the output reports it, so any image can be reproduced). Classifier-free guidance runs only
    with a `negative_prompt` and `true_cfg_scale > 1`, as in diffusers' Qwen-Image pipeline.
    `cache_threshold`: this request's first-block residual caching threshold (None: the stage's
    `residual_cache` setting; 0: off; docs/omni.md "Residual caching"); step scheduling only.
    `latency_slo_ms`: end-to-end latency target; the DiT stage turns it into `deadline`
    (wall-clock seconds, `time.time()`, counted from when the request entered the omni engine),
    which a `deadline` scheduling policy serves least-slack-first.
    """

    height: int | None = None
    width: int | None = None
    num_inference_steps: int = 50
    true_cfg_scale: float = 4.0
    negative_prompt: str | None = None
    seed: int | None = None
    output_type: str = "pil"
    cache_threshold: float | None = None
    latency_slo_ms: float | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        for name in ("latency_slo_ms", "deadline"):
            value = getattr(self, name)
            if value is not None and (not _is_finite(value) or value <= 0):
                raise ValueError(f"{name}: must be None or a positive number, got {value!r}")
        t = self.cache_threshold
        if t is not None and (not _is_finite(t) or not 0 <= t <= 1):
            raise ValueError(f"cache_threshold: must be None or a number in [0, 1], got {t!r}")
        for name in ("height", "width"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value <= 0):
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if not _is_int(self.num_inference_steps) or not 1 <= self.num_inference_steps <= 1000:
            raise ValueError(
                f"num_inference_steps: must be an integer in [1, 1000], "
                f"got {self.num_inference_steps!r}"
            )
        if isinstance(self.true_cfg_scale, bool) or not isinstance(
            self.true_cfg_scale, (int, float)
        ):
            raise ValueError(f"true_cfg_scale: must be a number, got {self.true_cfg_scale!r}")
        if self.true_cfg_scale < 0:
            raise ValueError(f"true_cfg_scale: must be >= 0, got {self.true_cfg_scale}")
        if self.negative_prompt is not None and not isinstance(self.negative_prompt, str):
            raise ValueError(f"negative_prompt: must be a string, got {type(self.negative_prompt)}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed: must be an integer in [0, 2**63), got {self.seed!r}")
        if self.output_type not in OUTPUT_TYPES:
            raise ValueError(
                f"output_type: must be one of {OUTPUT_TYPES}, got {self.output_type!r}"
            )

    @property
    def do_cfg(self) -> bool:
        return self.negative_prompt is not None and self.true_cfg_scale > 1

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DiffusionSamplingParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown diffusion parameter; known: {sorted(known)}")
        return cls(**values)


@dataclass(frozen=True)
class Code2WavParams:
    """What Qwen2.5-Omni's code2wav stage needs besides the codec tokens.

    `voice`: a speaker of the model's `spk_dict.pt`. `seed` of None draws a fresh one (the DiT
    starts from random noise; the output reports the seed). `num_steps`, `guidance_scale` and
    `sway_coefficient` are transformers' token2wav arguments, with its defaults:
    `guidance_scale` below 1e-5 turns classifier-free guidance off.

    Windowed decoding (streaming): `codec_tokens` may be a window of the request's whole codec
    sequence. `window_start` is the index, in that whole sequence, of the window's first code:
    the window is decoded with the noise frames the whole decode gives those codes (so the
    executor needs a seed; the stage fills one in). `keep` is a range `(start, end)` of codes,
    relative to the window, whose audio is returned; None returns all. The executor checks what
    depends on the model (the DiT's block alignment, the window's length).
    """

    voice: str = "Chelsie"
    seed: int | None = None
    num_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0
    window_start: int = 0
    keep: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.voice, str) or not self.voice:
            raise ValueError(f"voice: must be a non-empty string, got {self.voice!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed: must be an integer in [0, 2**63), got {self.seed!r}")
        # One step would return the initial noise itself: the solver needs two time points.
        if not _is_int(self.num_steps) or not 2 <= self.num_steps <= 1000:
            raise ValueError(f"num_steps: must be an integer in [2, 1000], got {self.num_steps!r}")
        if not _is_finite(self.guidance_scale) or self.guidance_scale < 0:
            raise ValueError(
                f"guidance_scale: must be a finite number >= 0, got {self.guidance_scale!r}"
            )
        if not _is_finite(self.sway_coefficient):
            raise ValueError(
                f"sway_coefficient: must be a finite number, got {self.sway_coefficient!r}"
            )
        if not _is_int(self.window_start) or self.window_start < 0:
            raise ValueError(f"window_start: must be an integer >= 0, got {self.window_start!r}")
        if self.keep is not None:
            keep = self.keep
            if (
                not isinstance(keep, (tuple, list))
                or len(keep) != 2
                or not all(_is_int(k) for k in keep)
                or not 0 <= keep[0] < keep[1]
            ):
                raise ValueError(
                    f"keep: must be None or two integers (start, end) with 0 <= start < end, "
                    f"got {keep!r}"
                )
            # A JSON body gives a list: store the tuple, so that equal params compare equal.
            object.__setattr__(self, "keep", tuple(keep))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Code2WavParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown code2wav parameter; known: {sorted(known)}")
        return cls(**values)


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
