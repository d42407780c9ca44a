# SPDX-License-Identifier: Apache-2.0
"""What the multipart routes (image edits, videos) share: a form's text fields read into its
request model, and an uploaded image decoded, each refusal a FieldError naming the field."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from vllm_omni.errors import FieldError


def form_body(model: type[BaseModel], fields: dict[str, str]) -> Any:
    """The form's text fields as `model` (read as a form's: "2" is 2)."""
    try:
        return model.model_validate(fields, strict=False)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise FieldError(param, first.get("msg", "invalid").removeprefix("Value error, ")) from None


async def decode_image(upload: Any, field: str, max_pixels: int, max_bytes: int) -> Image.Image:
    """An uploaded image as RGB; refused (naming `field`) if it is not a file, is over
    `max_bytes` or `max_pixels` (--max-image-pixels), or is not an image PIL reads."""
    if not isinstance(upload, UploadFile):
        raise FieldError(field, "must be a file, not a text field")
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FieldError(field, f"{upload.filename!r} is over {max_bytes} bytes")
    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > max_pixels:
            raise FieldError(
                field,
                f"{upload.filename!r} is {image.width}x{image.height}, over {max_pixels} pixels "
                "(--max-image-pixels)",
            )
        image.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise FieldError(field, f"{upload.filename!r} is not an image PIL can read: {e}") from None
    return image.convert("RGB")
