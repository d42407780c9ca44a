# SPDX-License-Identifier: Apache-2.0
"""The routes of a graph whose output is images: POST /v1/images/generations, POST
/v1/images/edits (image_edits.py) and POST /v1/chat/completions (the reply's content is
`image_url` parts), in OpenAI's shapes."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI, Request

from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.entrypoints.openai import image_edits
from vllm_omni.entrypoints.openai.image_runs import (
    finished,
    images_response,
    png_b64,
    run_images,
    size_multiple,
)
from vllm_omni.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ImageGenerationRequest,
    ImageOptions,
)
from vllm_omni.entrypoints.openai.server_utils import OmniServer


def add_routes(app: FastAPI, server: OmniServer) -> None:
    server.schema_extras.append(lambda schema: _schema_limits(schema, server))
    image_edits.add_routes(app, server)

    @app.post("/v1/images/generations")
    async def images(body: ImageGenerationRequest, request: Request):
        start = time.monotonic()
        prompt = _prompt(body.prompt, body)
        outputs, error = await run_images(server, "images", request, prompt, body)
        if error is not None:
            return error
        finished(server, "images", start, len(outputs))
        return images_response(outputs)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        start = time.monotonic()
        prompt = _prompt(body.prompt(), body)
        outputs, error = await run_images(server, "chat", request, prompt, body)
        if error is not None:
            return error
        finished(server, "chat", start, len(outputs))
        parts = [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png_b64(im)}"}}
            for out in outputs
            for im in out.images
        ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": server.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": parts},
                    "finish_reason": "stop",
                }
            ],
            "seeds": [out.seed for out in outputs],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }


def _schema_limits(schema: dict[str, Any], server: OmniServer) -> None:
    """The image bodies' size and work limits of this server (see protocol.py), and without
    the fields its image stages refuse."""
    config = server.config
    limits: dict[str, int] = {"x-max-pixels": config.max_pixels}
    steps = {"x-max-request-steps": config.max_request_steps}
    refused: frozenset[str] = frozenset()
    max_images = 0
    if server.omni is not None:
        limits["x-size-multiple"] = size_multiple(server.omni)
        infos = [i for i in server.omni.stage_info().values() if isinstance(i, ImageStageInfo)]
        refused = frozenset.intersection(*(i.refuses for i in infos)) if infos else refused
        max_images = max((i.max_input_images for i in infos), default=0)
    bodies = schema.get("components", {}).get("schemas", {})
    forms = [
        bodies[name]
        for name in ("ImageGenerationRequest", "ChatCompletionRequest")
        if name in bodies
    ]
    edit_forms = image_edits.published_forms(schema)
    for form in edit_forms:
        image_edits.state_limits(form, max_images, config.max_pixels)
    for body in forms + edit_forms:
        body["properties"]["size"].update(limits)
        for name in ("n", "num_inference_steps"):
            body["properties"][name].update(steps)
        for name in refused:
            body["properties"].pop(name, None)


def _prompt(text: str, body: ImageOptions) -> dict[str, str]:
    prompt = {"prompt": text}
    if body.negative_prompt is not None:
        prompt["negative_prompt"] = body.negative_prompt
    return prompt
