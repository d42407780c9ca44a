# SPDX-License-Identifier: Apache-2.0
"""The stage graphs of a pipeline run by its own `__call__`: one process stage, from the prompt's
text (and an editing pipeline's input images) to images, or from the prompt's text to video or
audio."""

from __future__ import annotations

from typing import Any


def pipeline_graph(
    model_type: str, executor: str, inputs: tuple[str, ...] = ("text", "image"), output="image"
) -> dict[str, Any]:
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
                "input_modalities": list(inputs),
                "output_modalities": [output],
                "final_output": True,
            },
        ],
    }


def stage_graph() -> dict[str, Any]:
    return pipeline_graph("diffusers_pipeline", "diffusers_pipeline")


def video_graph() -> dict[str, Any]:
    return pipeline_graph(
        "diffusers_video_pipeline", "diffusers_video_pipeline", ("text",), output="video"
    )


def audio_graph() -> dict[str, Any]:
    return pipeline_graph(
        "diffusers_audio_pipeline", "diffusers_audio_pipeline", ("text",), output="audio"
    )
