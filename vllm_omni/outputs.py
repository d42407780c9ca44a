# SPDX-License-Identifier: Apache-2.0
"""What OmniLLM returns: one OmniRequestOutput per request, built by MultimodalOutputProcessor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class StageTiming:
    """Monotonic-clock times of one stage for one request: `queued` when its inputs were
    ready, `start` when the stage accepted it (after back-pressure), `end` when it finished."""

    queued: float
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class OmniRequestOutput:
    request_id: str
    prompt: str | None
    images: list[Any] = field(default_factory=list)  # PIL images
    latents: torch.Tensor | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    audio: torch.Tensor | None = None  # float32 waveform: (samples,), or (channels, samples)
    sample_rate: int | None = None
    codec_token_ids: list[int] | None = None  # the speech codes the audio was decoded from
    video: np.ndarray | None = None  # uint8 frames, (frames, height, width, 3)
    fps: float | None = None  # the video's playback rate
    seed: int | None = None
    stage_timings: dict[str, StageTiming] = field(default_factory=dict)
    arrival: float = 0.0
    finished: float = 0.0

    @property
    def latency_s(self) -> float:
        return self.finished - self.arrival


class MultimodalOutputProcessor:
    """Turns the final stages' raw outputs (uint8 images and videos, latents, text, waveforms)
    into an OmniRequestOutput; the speech codes come from whichever stage made them."""

    def process(
        self,
        request_id: str,
        prompt: str | None,
        final_outputs: dict[str, dict[str, Any]],
        stage_outputs: dict[str, dict[str, Any]] | None = None,
        *,
        seed: int | None,
        stage_timings: dict[str, StageTiming],
        arrival: float,
        finished: float,
    ) -> OmniRequestOutput:
        from PIL import Image

        out = OmniRequestOutput(
            request_id=request_id,
            prompt=prompt,
            seed=seed,
            stage_timings=stage_timings,
            arrival=arrival,
            finished=finished,
        )
        for outputs in final_outputs.values():
            if "image" in outputs:
                out.images.append(Image.fromarray(np.asarray(outputs["image"], dtype=np.uint8)))
            if "latents" in outputs:
                out.latents = outputs["latents"]
            if "text" in outputs:
                out.text = outputs["text"]
                out.token_ids = outputs.get("token_ids")
                out.prompt_token_ids = outputs.get("prompt_token_ids")
                out.finish_reason = outputs.get("finish_reason")
            if "video" in outputs:
                out.video = np.asarray(outputs["video"], dtype=np.uint8)
                out.fps = outputs.get("fps")
            if "audio" in outputs:
                out.audio = outputs["audio"]
                out.sample_rate = outputs.get("sample_rate")
        for outputs in (stage_outputs or {}).values():
            if "codec_tokens" in outputs:
                out.codec_token_ids = outputs["codec_tokens"].tolist()
        return out
