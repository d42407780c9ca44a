# SPDX-License-Identifier: Apache-2.0
"""Request and error bodies of the OpenAI Images API, as the omni server accepts them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 10
SIZE_PATTERN = re.compile(r"^(\d+)x(\d+)$")


class ImageOptions(BaseModel):
    """What an image request may say about the image. Types are strict: `"n": "2"` is an
    error, not 2. Unknown fields are errors too."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    size: str | None = None
    user: str | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    num_inference_steps: int | None = Field(None, ge=1, le=1000)
    negative_prompt: str | None = None
    true_cfg_scale: float | None = Field(None, ge=0)

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


class ImageGenerationRequest(ImageOptions):
    """POST /v1/images/generations: OpenAI's fields, plus `seed`, `num_inference_steps`,
    `negative_prompt` and `true_cfg_scale` (send them with the client's `extra_body`)."""

    prompt: str
    response_format: Literal["b64_json"] = "b64_json"
    output_format: Literal["png"] = "png"
    quality: str | None = None  # accepted for compatibility; the model decides quality
    style: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(ImageOptions):
    """POST /v1/chat/completions on an image model: the last user message is the prompt and
    the reply's content is the image(s), as `image_url` parts with PNG data URLs."""

    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["image", "text"]] = ["image"]
    stream: Literal[False] = False
    # Text-generation knobs a client may send by habit; they do not apply to images.
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    @field_validator("modalities")
    @classmethod
    def _images_only(cls, value: list[str]) -> list[str]:
        if value != ["image"]:
            raise ValueError('this model generates images; use ["image"]')
        return value

    def prompt(self) -> str:
        users = [m for m in self.messages if m.role == "user"]
        if not users or not users[-1].text.strip():
            raise ValueError("messages: needs a last user message with text")
        return users[-1].text


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error", code: int = 400
) -> dict:
    """OpenAI's error shape: the client raises BadRequestError etc. with this message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
