# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-Omni's built-in stage graph."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    """Thinker (text; hands on its per-token hidden states) -> talker (speech-codec tokens) ->
    code2wav (waveform). Both the thinker's text and the waveform are final outputs; a request
    that asks for text only runs the thinker alone. A streamed request starts the talker with
    the thinker and code2wav with the talker (`stream_input`)."""
    return {
        "model_type": "qwen2_5_omni",
        "stages": [
            {
                "name": "thinker",
                "engine_type": "AR",
                "model": ".",
                "processor": "qwen25_omni_thinker",
                "input_modalities": ["text"],
                "output_modalities": ["text"],
                "final_output": True,
            },
            {
                "name": "talker",
                "engine_type": "AR",
                "model": ".",
                "processor": "qwen25_omni_talker",
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
                "executor": "code2wav",
                "inputs": {"codec_tokens": "talker.codec_tokens"},
                "input_modalities": ["codec"],
                "output_modalities": ["audio"],
                "stream_input": True,
                "final_output": True,
            },
        ],
    }
