# SPDX-License-Identifier: Apache-2.0
"""The stage graph of a pipeline run by its own `__call__`: one process stage, from the prompt's
text (and an editing pipeline's input images)."""

from __future__ import annotations

from typing import Any


def pipeline_graph(model_type: str, executor: str) -> dict[str, Any]:
    """One process stage running `executor` over the whole checkpoint."""
    return {
        "model_type": model_type,
        "stages": [
            {
                "name": "pipeline",
                "engine_type": "DiT",
                "model": ".",
                "executor": executor,
                "scheduler": "step",
                "input_modalities": ["text", "image"],
                "output_modalities": ["image"],
                "final_output": True,
            },
        ],
    }


def stage_graph() -> dict[str, Any]:
    return pipeline_graph("diffusers_pipeline", "diffusers_pipeline")
