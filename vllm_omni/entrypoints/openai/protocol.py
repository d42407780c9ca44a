# SPDX-License-Identifier: Apache-2.0
"""Request and error bodies of the OpenAI Images API, as the omni server accepts them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 10
SIZE_PATTERN = re.compile(r"^(\d+)x(\d+)$")


class ImageGenerationRequest(BaseModel):
    """POST /v1/images/generations. OpenAI's fields, plus `seed`, `num_inference_steps`,
    `negative_prompt` and `true_cfg_scale` (send them with the client's `extra_body`).
    Types are strict: `"n": "2"` is an error, not 2."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    size: str | None = None
    response_format: Literal["b64_json"] = "b64_json"
    output_format: Literal["png"] = "png"
    user: str | None = None
    quality: str | None = None  # accepted for compatibility; the model decides quality
    style: str | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    num_inference_steps: int | None = Field(None, ge=1, le=1000)
    negative_prompt: str | None = None
    true_cfg_scale: float | None = Field(None, ge=0)

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("size")
    @classmethod
    def _size_format(cls, value: str | None) -> str | None:
        if value is not None and not SIZE_PATTERN.match(value):
            raise ValueError("must be 'WIDTHxHEIGHT', e.g. '512x512'")
        return value

    def parsed_size(self) -> tuple[int, int] | None:
        """(width, height), or None for the model's default."""
        if self.size is None:
            return None
        width, height = SIZE_PATTERN.match(self.size).groups()
        return int(width), int(height)


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error", code: int = 400
) -> dict:
    """OpenAI's error shape: the client raises BadRequestError etc. with this message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
