# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's built-in stage graph."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    """The DiT stage decodes its own latents. A separate `vae_decoder` stage is an option
    (docs/stage_graphs.md): on a 2-core CPU it is no faster for the tiny model and slower for a
    compute-bound DiT, which then has fewer cores to itself."""
    return {
        "model_type": "qwen_image",
        "stages": [
            {
                "name": "text_encoder",
                "engine_type": "AR",
                "model": "text_encoder",
                "tokenizer": "tokenizer",
                "processor": "qwen_image_prompt",
                "input_modalities": ["text"],
                "output_modalities": ["embeddings"],
            },
            {
                "name": "dit",
                "engine_type": "DiT",
                "model": ".",
                "executor": "qwen_image",
                "inputs": {
                    "prompt_embeds": "text_encoder.prompt_embeds",
                    "negative_prompt_embeds": "text_encoder.negative_prompt_embeds",
                },
                "input_modalities": ["embeddings"],
                "output_modalities": ["image"],
                "scheduler": "step",
                "final_output": True,
            },
        ],
    }
