# SPDX-License-Identifier: Apache-2.0
"""The transformers functions this family's code follows or stands in for; tests/test_patches.py
fails when transformers changes one of them, so an upgrade forces a review."""

from __future__ import annotations


def pinned() -> list:
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf

    from vllm_omni._patches import Pinned

    dit = hf.Qwen2_5OmniToken2WavDiTModel
    return [
        Pinned(
            dit,
            "_create_block_diff",
            "7050b0336931",
            "block_attention replaces it per model with a [1, 1, 1, 1] placeholder: the layers "
            "turn its result into the band mask that block_band_attention computes itself.",
        ),
        Pinned(
            dit,
            "sample",
            "a12e16a7168a",
            "code2wav._sample_mel makes the same calls in the same order, from given noise "
            "(conditioning repeated per frame, guidance as a batch of two, the sway schedule, "
            "RungeKutta4ODESolver).",
        ),
        Pinned(
            hf.Qwen2_5OmniForConditionalGeneration,
            "generate",
            "f766a57731db",
            "talker.talker_input builds the talker's prompt as it does (thinker hidden + "
            "embedding rows, the voice's start row, text-end and text-pad), and the talker's "
            "sampling defaults are its.",
        ),
    ]
