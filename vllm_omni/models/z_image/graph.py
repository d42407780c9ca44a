# SPDX-License-Identifier: Apache-2.0
"""Z-Image's built-in stage graph: its Qwen3 text encoder on vLLM -> the DiT, step-batched."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    return {
        "model_type": "z_image",
        "stages": [
            {
                "name": "text_encoder",
                "engine_type": "AR",
                "model": "text_encoder",
                "tokenizer": "tokenizer",
                "processor": "z_image_prompt",
                "input_modalities": ["text"],
                "output_modalities": ["embeddings"],
            },
            {
                "name": "dit",
                "engine_type": "DiT",
                "model": ".",
                "executor": "z_image",
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
