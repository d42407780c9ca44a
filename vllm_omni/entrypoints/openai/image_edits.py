# SPDX-License-Identifier: Apache-2.0
"""POST /v1/images/edits, in OpenAI's shape: a multipart form with the input image(s) (`image`,
or `image[]` for several), `prompt`, `n`, `size` and the project's extras (`seed`,
`num_inference_steps`, `negative_prompt`, `true_cfg_scale`, `guidance_scale`). For graphs whose
image stage edits input images; other graphs answer 400 naming `image`."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException

from vllm_omni.entrypoints.openai.image_runs import finished, images_response, run_images
from vllm_omni.entrypoints.openai.protocol import ImageEditRequest
from vllm_omni.entrypoints.openai.server_utils import OmniServer, client_error
from vllm_omni.entrypoints.openai.uploads import decode_image, form_body
from vllm_omni.errors import FieldError

IMAGE_FIELDS = ("image", "image[]")
MAX_IMAGES = 16  # as OpenAI's edits; each pipeline takes fewer (its stage says how many)
MAX_IMAGE_BYTES = 16 * 2**20
MAX_FIELDS = 64


def add_routes(app: FastAPI, server: OmniServer) -> None:
    @app.post("/v1/images/edits", openapi_extra={"requestBody": _request_body()})
    async def edits(request: Request):
        start = time.monotonic()
        try:
            if "image" not in server.omni.request_options:
                raise FieldError(
                    "image", f"{server.model_name} edits no images: use /v1/images/generations"
                )
            body, images = await _read_form(request, server.config.max_pixels)
        except ValueError as e:
            server.metrics.requests.labels("edits", "rejected").inc()
            return client_error(e)
        prompt: dict[str, Any] = {"prompt": body.prompt, "image": images}
        if body.negative_prompt is not None:
            prompt["negative_prompt"] = body.negative_prompt
        outputs, error = await run_images(server, "edits", request, prompt, body)
        if error is not None:
            return error
        finished(server, "edits", start, len(outputs))
        return images_response(outputs)


async def _read_form(request: Request, max_pixels: int) -> tuple[ImageEditRequest, list]:
    """The form's fields and its decoded images; FieldError naming what is wrong."""
    try:
        form = await request.form(
            max_files=MAX_IMAGES + 1, max_fields=MAX_FIELDS, max_part_size=MAX_IMAGE_BYTES
        )
    except MultiPartException as e:
        raise FieldError("body", f"not a valid multipart form: {e.message}") from None
    fields: dict[str, str] = {}
    uploads: list[UploadFile] = []
    for key, value in form.multi_items():
        if key in IMAGE_FIELDS:
            uploads.append(value)
        elif key == "mask":
            raise FieldError("mask", "inpainting is not served: edits take no mask")
        elif isinstance(value, UploadFile):
            raise FieldError(key, "unexpected file field")
        elif key in fields:
            raise FieldError(key, "given twice")
        else:
            fields[key] = value
    body = form_body(ImageEditRequest, fields)
    if not uploads:
        raise FieldError("image", "required: one or more image files")
    if len(uploads) > MAX_IMAGES:
        raise FieldError("image", f"at most {MAX_IMAGES} images, got {len(uploads)}")
    return body, [
        await decode_image(upload, "image", max_pixels, MAX_IMAGE_BYTES) for upload in uploads
    ]


def _request_body() -> dict[str, Any]:
    """The form as the published schema states it (FastAPI cannot derive a form whose image
    field comes under two names)."""
    fields = ImageEditRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    image = {"type": "string", "format": "binary", "maxLength": MAX_IMAGE_BYTES}
    properties = {
        "image": {"anyOf": [image, {"type": "array", "items": image, "maxItems": MAX_IMAGES}]},
        **fields["properties"],
    }
    schema = {
        "type": "object",
        "properties": properties,
        "required": ["image", "prompt"],
        "additionalProperties": False,  # an unknown field is a 400 naming it
    }
    return {"required": True, "content": {"multipart/form-data": {"schema": schema}}}


def state_limits(form: dict[str, Any], max_images: int, max_pixels: int) -> None:
    """This server's limits on the form's images: how many its model takes (0: it says
    nothing) and their pixels (--max-image-pixels)."""
    one, many = form["properties"]["image"]["anyOf"]
    for file in (one, many["items"]):
        file["x-max-pixels"] = max_pixels
    if max_images:
        many["maxItems"] = max_images


def published_forms(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The edit form's schema in a published OpenAPI document (for the server's limits)."""
    operation = schema.get("paths", {}).get("/v1/images/edits", {}).get("post")
    if operation is None:
        return []
    return [operation["requestBody"]["content"]["multipart/form-data"]["schema"]]
