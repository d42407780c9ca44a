# SPDX-License-Identifier: Apache-2.0
"""MultimodalOutputProcessor: the final stages' raw outputs become one OmniRequestOutput."""

from __future__ import annotations

import numpy as np
import torch

from vllm_omni.outputs import MultimodalOutputProcessor, StageTiming


def _process(final: dict, stages: dict | None = None):
    timing = {"s": StageTiming(1.0, 2.0, 5.0)}
    return MultimodalOutputProcessor().process(
        "r", "a cat", final, stages, seed=3, stage_timings=timing, arrival=0.5, finished=6.0
    )


def test_images_and_latents() -> None:
    image = np.full((4, 6, 3), 200, dtype=np.uint8)
    out = _process({"dit": {"image": image}, "vae": {"latents": torch.ones(2)}})
    assert [im.size for im in out.images] == [(6, 4)]
    assert np.array_equal(np.asarray(out.images[0]), image)
    assert torch.equal(out.latents, torch.ones(2))
    assert (out.seed, out.latency_s, out.stage_timings["s"].seconds) == (3, 5.5, 3.0)


def test_text_audio_and_the_codes_of_whichever_stage_made_them() -> None:
    final = {
        "writer": {
            "text": "hi",
            "token_ids": [1],
            "prompt_token_ids": [7, 8],
            "finish_reason": "stop",
        },
        "voice": {"audio": torch.zeros(10), "sample_rate": 24_000},
    }
    stages = {**final, "speaker": {"codec_tokens": torch.tensor([4, 5])}}
    out = _process(final, stages)
    assert (out.text, out.token_ids, out.prompt_token_ids, out.finish_reason) == (
        "hi",
        [1],
        [7, 8],
        "stop",
    )
    assert out.sample_rate == 24_000 and out.audio.shape == (10,)
    assert out.codec_token_ids == [4, 5]
    assert out.images == [] and out.latents is None
