# SPDX-License-Identifier: Apache-2.0
"""Request and error bodies of the OpenAI Images API, as the omni server accepts them.

The published OpenAPI schema (/openapi.json) states what the server enforces, so that a client
(or a fuzzer) that follows it is accepted: patterns for `size` and the prompts, the user message
that chat needs, `modalities: ["image"]`. What JSON schema cannot say (the size multiple and the
pixel limit of the server at hand) is in `size`'s description and its `x-size-multiple` and
`x-max-pixels` keys, which the server fills in (api_server.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_N = 10
MAX_SEED = 2**63  # exclusive: torch.Generator.manual_seed takes any int64 >= 0
SIZE_PATTERN = r"^[1-9][0-9]{0,5}x[1-9][0-9]{0,5}$"
"""WIDTHxHEIGHT in ASCII digits, no leading zeros; checked with re.fullmatch, so that a trailing
newline is refused as JSON schema's (ECMA) `$` would refuse it."""
NON_BLANK_PATTERN = r"\S"  # a JSON schema pattern is a search: "has a non-whitespace character"


def _on_string(**keywords: Any) -> Callable[[dict[str, Any]], None]:
    """json_schema_extra that adds `keywords` to the string schema of a field, also when the
    field is `str | None` (there pydantic makes an anyOf with a null branch)."""

    def update(schema: dict[str, Any]) -> None:
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") == "string":
                branch.update(keywords)

    return update


def _int_fields(model: type[BaseModel]) -> set[str]:
    return {name for name, f in model.model_fields.items() if f.annotation in (int, int | None)}


def _has_text(text: str) -> bool:
    return re.search(NON_BLANK_PATTERN, text) is not None


def non_blank(value: str) -> str:
    """A prompt field's check: it must have a non-whitespace character."""
    if not _has_text(value):
        raise ValueError("must not be empty")
    return value


def matching(pattern: str, value: str | None, message: str) -> str | None:
    """A text field's check against its published pattern (None passes)."""
    if value is not None and not re.fullmatch(pattern, value):
        raise ValueError(message)
    return value


class StrictBody(BaseModel):
    """A request body whose types are strict: `"n": "2"` is an error, not 2 (`"n": 2.0` is 2:
    JSON numbers). Unknown fields are errors too."""

    model_config = ConfigDict(extra="forbid", strict=True)
    int_list_fields: ClassVar[tuple[str, ...]] = ()
    """Fields holding lists of integers, whose items are taken as JSON numbers too."""

    @model_validator(mode="before")
    @classmethod
    def _integral_floats_are_ints(cls, data: Any) -> Any:
        # JSON has one number type, and JSON schema's "integer" includes 7.0: take it as 7.
        # (A plain int field with a BeforeValidator would do this too, but pydantic then
        # publishes its bounds as "ge"/"le", which JSON schema does not know.) "7" stays an error.
        if not isinstance(data, dict):
            return data
        ints = _int_fields(cls)
        out = {k: _as_int(v) if k in ints else v for k, v in data.items()}
        for k in cls.int_list_fields:
            if isinstance(out.get(k), list):
                out[k] = [_as_int(v) for v in out[k]]
        return out


def _as_int(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


class ImageOptions(StrictBody):
    """What an image request may say about the image."""

    model: str | None = None
    n: int = Field(
        1,
        ge=1,
        le=MAX_N,
        description="Images to make; they get seeds seed, seed+1, ... n x num_inference_steps "
        "(default 50) is at most `x-max-request-steps` (the server's --max-request-steps).",
    )
    size: str | None = Field(
        None,
        description="WIDTHxHEIGHT in pixels, e.g. '512x512' (default: the model's). Width and "
        "height must be multiples of `x-size-multiple` (the model's), and width * height "
        "at most `x-max-pixels` (the server's --max-image-pixels).",
        json_schema_extra=_on_string(pattern=SIZE_PATTERN),
    )
    user: str | None = None
    seed: int | None = Field(
        None, ge=0, lt=MAX_SEED, description="Image i gets seed (seed + i) mod 2**63."
    )
    num_inference_steps: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Denoising steps per image (default 50); n x num_inference_steps is at most "
        "`x-max-request-steps` (the server's --max-request-steps).",
    )
    negative_prompt: str | None = None
    true_cfg_scale: float | None = Field(None, ge=0, allow_inf_nan=False)
    guidance_scale: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="For models whose pipeline takes one (Stable Diffusion 3, "
        "Flux, Z-Image); default: the pipeline's",
    )
    cache_threshold: float | None = Field(
        None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="First-block residual caching threshold for this request (0: off; "
        "default: the server's --dit-cache)",
    )
    latency_slo_ms: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Latency target: with --dit-scheduling-policy deadline the DiT stage "
        "serves the least slack first; with --dit-admission-control a request that cannot "
        "meet it is refused with 429",
    )

    @field_validator("size")
    @classmethod
    def _size_format(cls, value: str | None) -> str | None:
        return matching(SIZE_PATTERN, value, "must be 'WIDTHxHEIGHT', e.g. '512x512'")

    def parsed_size(self) -> tuple[int, int] | None:
        """(width, height), or None for the model's default."""
        if self.size is None:
            return None
        width, height = self.size.split("x")
        return int(width), int(height)


class ImageGenerationRequest(ImageOptions):
    """POST /v1/images/generations: OpenAI's fields, plus `seed`, `num_inference_steps`,
    `negative_prompt`, `true_cfg_scale`, `guidance_scale`, `cache_threshold` and `latency_slo_ms`
    (send them with the client's `extra_body`)."""

    prompt: str = Field(json_schema_extra=_on_string(minLength=1, pattern=NON_BLANK_PATTERN))
    response_format: Literal["b64_json"] = "b64_json"
    output_format: Literal["png"] = "png"
    quality: str | None = None  # accepted for compatibility; the model decides quality
    style: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: str) -> str:
        return non_blank(value)


class ImageEditRequest(ImageGenerationRequest):
    """POST /v1/images/edits: the fields of OpenAI's multipart image-edit form besides the
    images (`image`, or `image[]` for several), with the same extras as generations. Form
    fields arrive as text, so they are read as a form's (`"2"` is 2)."""

    background: str | None = None  # accepted for compatibility; not used
    input_fidelity: str | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


_USER_TEXT = {
    "anyOf": [
        {"type": "string", "pattern": NON_BLANK_PATTERN},
        {
            "type": "array",
            "contains": {
                "required": ["text"],
                "properties": {"text": {"pattern": NON_BLANK_PATTERN}},
            },
        },
    ]
}


class ChatMessage(BaseModel):
    """A user message needs text (the prompt is the last one's); others may be empty."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "if": {"properties": {"role": {"const": "user"}}},
            "then": {"properties": {"content": _USER_TEXT}},
        },
    )

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    @field_validator("content")
    @classmethod
    def _user_has_text(cls, value: str | list[TextPart], info: ValidationInfo):
        text = value if isinstance(value, str) else "\n".join(part.text for part in value)
        if info.data.get("role") == "user" and not _has_text(text):
            raise ValueError("a user message needs text (the last one is the prompt)")
        return value

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(ImageOptions):
    """POST /v1/chat/completions on an image model: the last user message is the prompt and
    the reply's content is the image(s), as `image_url` parts with PNG data URLs."""

    messages: list[ChatMessage] = Field(
        min_length=1,
        json_schema_extra={
            "contains": {"required": ["role"], "properties": {"role": {"const": "user"}}}
        },
    )
    # list[str], not list[Literal["image"]]: the validator's message says what to send instead.
    modalities: list[str] = Field(
        ["image"],
        json_schema_extra={
            "items": {"type": "string", "const": "image"},
            "minItems": 1,
            "maxItems": 1,
        },
    )
    stream: Literal[False] = False
    # Text-generation knobs a client may send by habit; they do not apply to images.
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    @field_validator("messages")
    @classmethod
    def _has_user_message(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.role == "user" for m in value):
            raise ValueError("needs a user message with the prompt")
        return value

    @field_validator("modalities")
    @classmethod
    def _images_only(cls, value: list[str]) -> list[str]:
        if value != ["image"]:
            raise ValueError('this model generates images; use ["image"]')
        return value

    def prompt(self) -> str:
        """The last user message (validation made sure there is one, with text)."""
        return [m for m in self.messages if m.role == "user"][-1].text


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error", code: int = 400
) -> dict:
    """OpenAI's error shape: the client raises BadRequestError etc. with this message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
