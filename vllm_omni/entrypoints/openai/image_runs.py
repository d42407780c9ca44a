# SPDX-License-Identifier: Apache-2.0
"""Running an image request's n images through the stage graph, for every image route
(generations, edits, chat): parameters per image, metrics, the reply."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.entrypoints.async_omni_llm import AsyncOmniLLM
from vllm_omni.entrypoints.openai.protocol import MAX_SEED, ImageOptions
from vllm_omni.entrypoints.openai.request_runs import run_requests
from vllm_omni.entrypoints.openai.server_utils import OmniServer, client_error
from vllm_omni.errors import FieldError


async def run_images(
    server: OmniServer, endpoint: str, request: Request, prompt: dict, body: ImageOptions
) -> tuple[list | None, Response | None]:
    """Run body.n images of `prompt`; returns (outputs, None) or (None, error response)."""
    try:
        params = diffusion_params(body, server.omni, server.config)
    except ValueError as e:
        server.metrics.requests.labels(endpoint, "rejected").inc()
        return None, client_error(e)
    return await run_requests(server, endpoint, request, prompt, params)


def finished(server: OmniServer, endpoint: str, start: float, num_images: int) -> None:
    server.metrics.requests.labels(endpoint, "finished").inc()
    server.metrics.images.inc(num_images)
    server.metrics.latency.labels(endpoint).observe(time.monotonic() - start)


def images_response(outputs: list) -> dict[str, Any]:
    """OpenAI's ImagesResponse (with each image's seed)."""
    data = [
        {"b64_json": png_b64(out.images[0]), "revised_prompt": None, "seed": out.seed}
        for out in outputs
    ]
    width, height = outputs[0].images[0].size
    return {
        "created": int(time.time()),
        "data": data,
        "size": f"{width}x{height}",
        "output_format": "png",
    }


def diffusion_params(
    body: ImageOptions, omni: AsyncOmniLLM, config
) -> list[DiffusionSamplingParams]:
    """One parameter set per image: `n` images get seeds seed, seed+1, ... mod 2**63 (or
    fresh ones)."""
    size = body.parsed_size()
    kwargs: dict[str, Any] = {}
    if size is not None:
        width, height = size
        if width * height > config.max_pixels:
            raise FieldError(
                "size",
                f"{width}x{height} is {width * height} pixels; the limit is "
                f"{config.max_pixels} (--max-image-pixels)",
            )
        multiple = size_multiple(omni)
        if width % multiple or height % multiple or not width or not height:
            raise FieldError("size", f"width and height must be positive multiples of {multiple}")
        kwargs.update(width=width, height=height)
    if body.num_inference_steps is not None:
        kwargs["num_inference_steps"] = body.num_inference_steps
    steps = body.num_inference_steps or DiffusionSamplingParams.num_inference_steps
    if body.n * steps > config.max_request_steps:
        field = "n" if body.num_inference_steps is None else "num_inference_steps"
        raise FieldError(
            f"{field}",
            f"n x num_inference_steps is {body.n} x {steps} = {body.n * steps}; the "
            f"limit is {config.max_request_steps} per request (--max-request-steps)",
        )
    if body.true_cfg_scale is not None:
        kwargs["true_cfg_scale"] = body.true_cfg_scale
    if body.guidance_scale is not None:
        kwargs["guidance_scale"] = body.guidance_scale
    if body.cache_threshold is not None:
        kwargs["cache_threshold"] = body.cache_threshold
    if body.latency_slo_ms is not None:
        kwargs["latency_slo_ms"] = body.latency_slo_ms
    if body.seed is None:
        seeds = [None] * body.n
    else:  # wrapping, so that every seed the schema allows works with every n
        seeds = [(body.seed + i) % MAX_SEED for i in range(body.n)]
    return [DiffusionSamplingParams(seed=seed, **kwargs) for seed in seeds]


def size_multiple(omni: AsyncOmniLLM) -> int:
    infos = omni.stage_info().values()
    return max((i.size_multiple for i in infos if isinstance(i, ImageStageInfo)), default=1)


def png_b64(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
