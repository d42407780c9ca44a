# SPDX-License-Identifier: Apache-2.0
"""Per-request parameters of Qwen2.5-Omni's code2wav stage, validated at construction."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_omni.diffusion.params import is_finite, is_int, params_from_dict
from vllm_omni.errors import FieldError


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

    deadline = None  # no latency target: the stage loop serves it first come, first served

    def __post_init__(self) -> None:
        if not isinstance(self.voice, str) or not self.voice:
            raise FieldError("voice", f"must be a non-empty string, got {self.voice!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise FieldError("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        # One step would return the initial noise itself: the solver needs two time points.
        if not is_int(self.num_steps) or not 2 <= self.num_steps <= 1000:
            raise FieldError(
                "num_steps", f"must be an integer in [2, 1000], got {self.num_steps!r}"
            )
        if not is_finite(self.guidance_scale) or self.guidance_scale < 0:
            raise FieldError(
                "guidance_scale", f"must be a finite number >= 0, got {self.guidance_scale!r}"
            )
        if not is_finite(self.sway_coefficient):
            raise FieldError(
                "sway_coefficient", f"must be a finite number, got {self.sway_coefficient!r}"
            )
        if not is_int(self.window_start) or self.window_start < 0:
            raise FieldError("window_start", f"must be an integer >= 0, got {self.window_start!r}")
        if self.keep is not None:
            keep = self.keep
            if (
                not isinstance(keep, (tuple, list))
                or len(keep) != 2
                or not all(is_int(k) for k in keep)
                or not 0 <= keep[0] < keep[1]
            ):
                raise FieldError(
                    "keep",
                    f"must be None or two integers (start, end) with 0 <= start < end, "
                    f"got {keep!r}",
                )
            # A JSON body gives a list: store the tuple, so that equal params compare equal.
            object.__setattr__(self, "keep", tuple(keep))

    @property
    def total_steps(self) -> int:
        return self.num_steps

    @property
    def rows(self) -> int:
        """Rows of one solver step: the unconditional one too under guidance (code2wav.py)."""
        return 2 if self.guidance_scale >= 1e-5 else 1

    def step_key(self, inputs: Mapping[str, Any]) -> Hashable:
        return self.call_key(inputs)

    def call_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """One batch needs equal code counts (no padding: the DiT attends over every frame) and
        one voice (its reference mel sets the shape of the speaker input)."""
        codes = inputs.get("codec_tokens")
        num_codes = -1 if codes is None else int(codes.numel())
        return (num_codes, self.voice, self.num_steps, self.guidance_scale, self.sway_coefficient)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Code2WavParams:
        return params_from_dict(cls, values, "code2wav")
