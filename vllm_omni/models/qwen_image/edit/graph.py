# SPDX-License-Identifier: Apache-2.0
"""The editing pipelines' built-in stage graph: Qwen2.5-VL reading the prompt and the input
images on vLLM -> the DiT, step-batched, with the images' VAE latents as conditioning."""

from __future__ import annotations

from typing import Any


def edit_graph(model_type: str, processor: str) -> dict[str, Any]:
    """`processor`: the registered prompt encoder of the pipeline's variant."""
    return {
        "model_type": model_type,
        "stages": [
            {
                "name": "text_encoder",
                "engine_type": "AR",
                "model": "text_encoder",
                "tokenizer": "tokenizer",
                "hf_processor": "processor",
                "processor": processor,
                "input_modalities": ["text", "image"],
                "output_modalities": ["embeddings"],
            },
            {
                "name": "dit",
                "engine_type": "DiT",
                "model": ".",
                "executor": "qwen_image_edit",
                "inputs": {
                    "prompt_embeds": "text_encoder.prompt_embeds",
                    "negative_prompt_embeds": "text_encoder.negative_prompt_embeds",
                },
                "input_modalities": ["embeddings", "image"],
                "output_modalities": ["image"],
                "scheduler": "step",
                "final_output": True,
            },
        ],
    }
