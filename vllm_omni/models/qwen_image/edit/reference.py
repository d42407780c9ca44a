# SPDX-License-Identifier: Apache-2.0
"""diffusers' editing pipelines with their text encoder given the model's image positions.

Qwen2.5-VL places image tokens on a 3-D (M-RoPE) grid. transformers 5 computes that grid only
when the call carries `mm_token_type_ids`, which the processor returns but diffusers 0.42's
editing pipelines do not pass on; without it the image tokens get text positions and the edit
drifts from the model's (by up to half the pixel range on the tiny pipelines). vLLM, which runs
the encoder stage here, computes the grid itself. `with_image_positions(pipe)` makes a loaded
pipeline's encoder do the same, for comparing against it (the tests, benchmarks/image_edits.py).
"""

from __future__ import annotations

from typing import Any


def with_image_positions(pipe: Any) -> Any:
    """`pipe`, its text encoder now marking image tokens (`mm_token_type_ids`) where a call
    gives none. Returns the pipeline; changes only this instance."""
    encoder = pipe.text_encoder
    forward = encoder.forward
    image_token = encoder.config.image_token_id

    def marked(input_ids=None, **kwargs):
        if kwargs.get("mm_token_type_ids") is None and input_ids is not None:
            kwargs["mm_token_type_ids"] = (input_ids == image_token).int()
        return forward(input_ids=input_ids, **kwargs)

    encoder.forward = marked
    return pipe
