# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni's built-in stage graph."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    """Thinker (text; hands on, per token, its accepted layer's output and input embedding) ->
    talker with its code predictor (speech-codec frames) -> code2wav (waveform). Both the text
    and the waveform are final outputs; a request that asks for text only runs the thinker
    alone. On a streamed request the talker starts with the thinker and speaks as far as its
    rows have come, and code2wav decodes chunks of frames as they come (`stream_input`)."""
    return {
        "model_type": "qwen3_omni",
        "stages": [
            {
                "name": "thinker",
                "engine_type": "AR",
                "model": ".",
                "processor": "qwen3_omni_thinker",
                "input_modalities": ["text"],
                "output_modalities": ["text"],
                "final_output": True,
            },
            {
                "name": "talker",
                "engine_type": "AR",
                "model": ".",
                "processor": "qwen3_omni_talker",
                "inputs": {
                    "thinker_states": "thinker.thinker_states",
                    "prompt_token_ids": "thinker.prompt_token_ids",
                },
                "input_modalities": ["embeddings"],
                "output_modalities": ["codec"],
                "stream_input": True,
            },
            {
                "name": "code2wav",
                "engine_type": "DiT",
                "model": ".",
                "executor": "qwen3_code2wav",
                "inputs": {"codec_tokens": "talker.codec_tokens"},
                "input_modalities": ["codec"],
                "output_modalities": ["audio"],
                "stream_input": True,
                "final_output": True,
            },
        ],
    }
