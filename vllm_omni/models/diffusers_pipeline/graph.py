# SPDX-License-Identifier: Apache-2.0
"""The stage graph of a pipeline served whole: one process stage, from the prompt's text."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    return {
        "model_type": "diffusers_pipeline",
        "stages": [
            {
                "name": "pipeline",
                "engine_type": "DiT",
                "model": ".",
                "executor": "diffusers_pipeline",
                "scheduler": "fifo",
                "input_modalities": ["text"],
                "output_modalities": ["image"],
                "final_output": True,
            },
        ],
    }
