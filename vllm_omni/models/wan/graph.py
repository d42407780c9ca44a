# SPDX-License-Identifier: Apache-2.0
"""Wan's built-in stage graph: one process stage holding the whole pipeline (UMT5 text encoder,
the DiT - both experts of Wan2.2 - and the VAE), step-batched."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    return {
        "model_type": "wan",
        "stages": [
            {
                "name": "dit",
                "engine_type": "DiT",
                "model": ".",
                "executor": "wan",
                "scheduler": "step",
                "input_modalities": ["text", "image"],
                "output_modalities": ["video"],
                "final_output": True,
            },
        ],
    }
