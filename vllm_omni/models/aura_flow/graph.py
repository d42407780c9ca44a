# SPDX-License-Identifier: Apache-2.0
"""AuraFlow's built-in stage graph: one process stage holding the whole pipeline (its UMT5 text
encoder, the DiT and the VAE), step-batched."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    return {
        "model_type": "aura_flow",
        "stages": [
            {
                "name": "dit",
                "engine_type": "DiT",
                "model": ".",
                "executor": "aura_flow",
                "scheduler": "step",
                "input_modalities": ["text"],
                "output_modalities": ["image"],
                "final_output": True,
            },
        ],
    }
