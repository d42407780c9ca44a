# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni's built-in stage graph."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    """The thinker (text, on vLLM's own Qwen3-Omni thinker), handing on for every token the
    hidden state of the layer the talker reads and its input embedding. The talker, its code
    predictor and code2wav are not served yet: asking for audio is refused naming
    `modalities`."""
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
        ],
    }
