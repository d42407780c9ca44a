# SPDX-License-Identifier: Apache-2.0
"""The omni server: OpenAI-compatible endpoints over an AsyncOmniLLM stage graph.

    vllm serve path/to/Qwen-Image --omni        (or: vllm-omni serve path/to/Qwen-Image)

Routes: POST /v1/images/generations, POST /v1/chat/completions (image models: the reply's
content is `image_url` parts; models that write and speak, e.g. Qwen2.5-Omni: text and audio in
OpenAI's shapes, streamed or not, see speech_chat.py), GET /v1/models, GET /health,
GET /metrics. `--api-key` guards every route. Bad input gets HTTP 400 with an OpenAI-style
error body naming the field; a client that disconnects cancels its request in every stage.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
import uuid
from collections.abc import Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from vllm.exceptions import VLLMClientError, VLLMValidationError

from vllm_omni.config.model_defaults import resolve_stage_graph
from vllm_omni.diffusion.deadline import DeadlineUnreachable
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.engine.omni_engine import StageEvent
from vllm_omni.entrypoints.async_omni_llm import AsyncOmniLLM, RequestFinished
from vllm_omni.entrypoints.openai import speech_chat
from vllm_omni.entrypoints.openai.metrics import OmniMetrics
from vllm_omni.entrypoints.openai.protocol import (
    MAX_SEED,
    ChatCompletionRequest,
    ImageGenerationRequest,
    ImageOptions,
    error_body,
)
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

DISCONNECT_POLL_S = 0.5
DEFAULT_MAX_PIXELS = 2048 * 2048
DEFAULT_MAX_REQUEST_STEPS = 200
"""n x num_inference_steps of one image request: four images of 50 steps. With the pixel limit
it bounds the work one request can hold the DiT stage with."""


@dataclass(frozen=True)
class ServerConfig:
    model: str
    served_model_name: str
    api_keys: tuple[str, ...] = ()
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_request_steps: int = DEFAULT_MAX_REQUEST_STEPS
    stage_configs: Any = None
    stage_overrides: Mapping[str, Any] | None = None
    revision: str | None = None
    download_dir: str | None = None


class ClientDisconnected(Exception):
    pass


class APIKeyMiddleware:
    """Every route needs `Authorization: Bearer <key>`. Plain ASGI (not Starlette's
    BaseHTTPMiddleware, which hides the client's disconnect from the endpoint)."""

    def __init__(self, app, api_keys: tuple[str, ...]) -> None:
        self.app = app
        self.api_keys = api_keys

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if header.removeprefix("Bearer ").strip() not in self.api_keys:
                body = error_body(
                    "invalid or missing API key", kind="authentication_error", code=401
                )
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(config: ServerConfig, omni: AsyncOmniLLM | None = None) -> FastAPI:
    """The FastAPI app; it starts the stage graph on startup unless `omni` is given."""
    metrics = OmniMetrics()
    state: dict[str, Any] = {"omni": omni}
    graph = (
        omni.graph
        if omni is not None
        else resolve_stage_graph(
            config.model,
            config.stage_configs,
            config.stage_overrides,
            revision=config.revision,
            download_dir=config.download_dir,
        )
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if state["omni"] is None:
            state["omni"] = await AsyncOmniLLM.create(stage_configs=graph)
        _observe_stages(state["omni"], metrics)
        logger.info(
            "omni server ready: %s (stages %s)",
            config.served_model_name,
            ", ".join(state["omni"].graph.names),
        )
        try:
            yield
        finally:
            state["omni"].shutdown()

    app = FastAPI(title="vllm-omni", lifespan=lifespan)

    if config.api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=config.api_keys)

    def openapi() -> dict[str, Any]:
        """FastAPI's schema plus the size limits of this server, which JSON schema cannot
        state (see protocol.py). FastAPI builds it on the first GET /openapi.json, after
        startup, when the graph (and so the size multiple) is known."""
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)  # builds and caches app.openapi_schema
            _integer_bounds(schema)
            limits: dict[str, int] = {"x-max-pixels": config.max_pixels}
            steps = {"x-max-request-steps": config.max_request_steps}
            if state["omni"] is not None:
                limits["x-size-multiple"] = _size_multiple(state["omni"])
            bodies = schema.get("components", {}).get("schemas", {})
            for body in ("ImageGenerationRequest", "ChatCompletionRequest"):
                if body in bodies:  # the image bodies, on a server with an image stage
                    bodies[body]["properties"]["size"].update(limits)
                    for field in ("n", "num_inference_steps"):
                        bodies[body]["properties"][field].update(steps)
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI's own refusals (a body that is not UTF-8, an unknown route, a wrong method)
        # in OpenAI's error shape too, not FastAPI's {"detail": ...}.
        kind = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        body = error_body(str(exc.detail), kind=kind, code=exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
            error = first.get("ctx", {}).get("error", "")
            return _bad_request(f"the body is not valid JSON: {error}".rstrip(": "), None)
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(loc) or None
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        return _bad_request(f"{param}: {message}" if param else message, param)

    @app.get("/health")
    async def health() -> Response:
        dead = state["omni"].engine.dead_stages()
        if dead:
            message = f"stage(s) {', '.join(dead)} stopped; restart the server"
            return JSONResponse(error_body(message, kind="service_unavailable", code=503), 503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": config.served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm-omni",
                    "root": config.model,
                }
            ],
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.update_from_stats(await state["omni"].stats())
        body = generate_latest(metrics.registry) + generate_latest(REGISTRY)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def run_images(endpoint: str, request: Request, prompt: dict, body: ImageOptions):
        """Run body.n images of `prompt`; returns (outputs, None) or (None, error response)."""
        omni: AsyncOmniLLM = state["omni"]
        try:
            params = _diffusion_params(body, omni, config)
            prepared = [omni.prepare(prompt, p) for p in params]  # fail before running anything
        except ValueError as e:
            metrics.requests.labels(endpoint, "rejected").inc()
            return None, _bad_request(str(e), _field_of(str(e)))
        jobs = [omni.engine.run_prepared(*x) for x in prepared]
        try:
            return await _cancel_on_disconnect(request, asyncio.gather(*jobs)), None
        except ClientDisconnected:
            metrics.requests.labels(endpoint, "cancelled").inc()
            return None, Response(status_code=499)
        except asyncio.CancelledError:  # the server cancelled the handler (client gone)
            metrics.requests.labels(endpoint, "cancelled").inc()
            raise
        except DeadlineUnreachable as e:  # admission control: come back later
            metrics.requests.labels(endpoint, "overloaded").inc()
            body = error_body(str(e), "latency_slo_ms", kind="rate_limit_exceeded", code=429)
            return None, JSONResponse(body, 429)
        except ValueError as e:
            metrics.requests.labels(endpoint, "rejected").inc()
            return None, _bad_request(str(e), _field_of(str(e)))
        except Exception as e:  # a stage failed: report it, keep serving
            logger.exception("image request failed")
            metrics.requests.labels(endpoint, "failed").inc()
            return None, JSONResponse(error_body(str(e), kind="internal_error", code=500), 500)

    def finished(endpoint: str, start: float, num_images: int) -> None:
        metrics.requests.labels(endpoint, "finished").inc()
        metrics.images.inc(num_images)
        metrics.latency.labels(endpoint).observe(time.monotonic() - start)

    # Each route where the graph has a stage that serves it.
    if "image" not in graph.output_modalities:
        if {"text", "audio"} & set(graph.output_modalities):
            _add_speech_chat(app, state, config, metrics)
        return app

    @app.post("/v1/images/generations")
    async def images(body: ImageGenerationRequest, request: Request):
        start = time.monotonic()
        outputs, error = await run_images("images", request, _prompt(body.prompt, body), body)
        if error is not None:
            return error
        data = [
            {"b64_json": _png_b64(out.images[0]), "revised_prompt": None, "seed": out.seed}
            for out in outputs
        ]
        finished("images", start, len(data))
        width, height = outputs[0].images[0].size
        return {
            "created": int(time.time()),
            "data": data,
            "size": f"{width}x{height}",
            "output_format": "png",
        }

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        start = time.monotonic()
        outputs, error = await run_images("chat", request, _prompt(body.prompt(), body), body)
        if error is not None:
            return error
        finished("chat", start, len(outputs))
        parts = [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_png_b64(im)}"}}
            for out in outputs
            for im in out.images
        ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": config.served_model_name,
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

    return app


def _add_speech_chat(app: FastAPI, state: dict, config: ServerConfig, metrics: OmniMetrics) -> None:
    """Chat completions for a graph whose outputs are text and audio (speech_chat.py)."""

    @app.post("/v1/chat/completions")
    async def chat(body: speech_chat.SpeechChatRequest, request: Request):
        omni: AsyncOmniLLM = state["omni"]
        start = time.monotonic()
        try:
            inputs, params = omni.prepare(body.omni_prompt(), body.stage_params(omni.graph.names))
        except CLIENT_ERRORS as e:  # vLLM's SamplingParams checks raise its own kind
            metrics.requests.labels("chat", "rejected").inc()
            return _client_error(e)
        request_id = uuid.uuid4().hex
        events: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(
            omni.engine.run_prepared(inputs, params, request_id, on_event=events.put_nowait)
        )

        def done(t: asyncio.Task) -> None:
            if t.cancelled():
                return
            error = t.exception()
            events.put_nowait(error if error is not None else RequestFinished(t.result()))

        task.add_done_callback(done)
        # The first partial output (or the end) decides between a reply and a 400: messages
        # that vLLM cannot render fail here, before any byte is sent.
        first = await _next_output(events)
        if _is_client_error(first):
            metrics.requests.labels("chat", "rejected").inc()
            return _client_error(first)
        if isinstance(first, Exception):
            logger.error("chat request failed: %s", first)
            metrics.requests.labels("chat", "failed").inc()
            return JSONResponse(error_body(str(first), kind="internal_error", code=500), 500)
        if body.stream:

            async def sse():
                try:
                    async for line in speech_chat.stream_events(
                        body, _OutputQueue(events), first, config.served_model_name, request_id
                    ):
                        yield line
                finally:
                    task.cancel()
                    metrics.latency.labels("chat").observe(time.monotonic() - start)

            metrics.requests.labels("chat", "finished").inc()
            return StreamingResponse(sse(), media_type="text/event-stream")
        try:
            while not isinstance(first, RequestFinished | Exception):
                first = await _cancel_on_disconnect(request, _next_output(events))
        except ClientDisconnected:
            task.cancel()
            metrics.requests.labels("chat", "cancelled").inc()
            return Response(status_code=499)
        if isinstance(first, Exception):
            metrics.requests.labels("chat", "failed").inc()
            if _is_client_error(first):
                return _client_error(first)
            return JSONResponse(error_body(str(first), kind="internal_error", code=500), 500)
        metrics.requests.labels("chat", "finished").inc()
        metrics.latency.labels("chat").observe(time.monotonic() - start)
        return speech_chat.completion(body, first.output, config.served_model_name)


async def _next_output(events: asyncio.Queue):
    """The next text delta, final output or error of a request (stage start/finish events are
    skipped)."""
    while True:
        event = await events.get()
        if not isinstance(event, StageEvent):
            return event


class _OutputQueue:
    """`events` without the stage start/finish events."""

    def __init__(self, events: asyncio.Queue) -> None:
        self.events = events

    async def get(self):
        return await _next_output(self.events)


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _integer_bounds(node: Any) -> None:
    """Integer schemas get their bounds back as integers, in place: FastAPI's OpenAPI model
    holds every bound as a float (`1000.0`), which reads as a fraction to some clients and
    cannot hold every int64 exactly."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in _BOUNDS:
                if isinstance(node.get(key), float) and node[key].is_integer():
                    node[key] = int(node[key])
        for value in node.values():
            _integer_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _integer_bounds(value)


def _prompt(text: str, body: ImageOptions) -> dict[str, str]:
    prompt = {"prompt": text}
    if body.negative_prompt is not None:
        prompt["negative_prompt"] = body.negative_prompt
    return prompt


def _diffusion_params(
    body: ImageOptions, omni: AsyncOmniLLM, config: ServerConfig
) -> list[DiffusionSamplingParams]:
    """One parameter set per image: `n` images get seeds seed, seed+1, ... mod 2**63 (or
    fresh ones)."""
    size = body.parsed_size()
    kwargs: dict[str, Any] = {}
    if size is not None:
        width, height = size
        if width * height > config.max_pixels:
            raise ValueError(
                f"size: {width}x{height} is {width * height} pixels; the limit is "
                f"{config.max_pixels} (--max-image-pixels)"
            )
        multiple = _size_multiple(omni)
        if width % multiple or height % multiple or not width or not height:
            raise ValueError(f"size: width and height must be positive multiples of {multiple}")
        kwargs.update(width=width, height=height)
    if body.num_inference_steps is not None:
        kwargs["num_inference_steps"] = body.num_inference_steps
    steps = body.num_inference_steps or DiffusionSamplingParams.num_inference_steps
    if body.n * steps > config.max_request_steps:
        field = "n" if body.num_inference_steps is None else "num_inference_steps"
        raise ValueError(
            f"{field}: n x num_inference_steps is {body.n} x {steps} = {body.n * steps}; the "
            f"limit is {config.max_request_steps} per request (--max-request-steps)"
        )
    if body.true_cfg_scale is not None:
        kwargs["true_cfg_scale"] = body.true_cfg_scale
    if body.cache_threshold is not None:
        kwargs["cache_threshold"] = body.cache_threshold
    if body.latency_slo_ms is not None:
        kwargs["latency_slo_ms"] = body.latency_slo_ms
    if body.seed is None:
        seeds = [None] * body.n
    else:  # wrapping, so that every seed the schema allows works with every n
        seeds = [(body.seed + i) % MAX_SEED for i in range(body.n)]
    return [DiffusionSamplingParams(seed=seed, **kwargs) for seed in seeds]


def _size_multiple(omni: AsyncOmniLLM) -> int:
    multiples = [
        s.info.get("size_multiple", 1)
        for s in omni.engine.stages.values()
        if s.engine_type == "DiT"
    ]
    return max(multiples, default=1)


async def _cancel_on_disconnect(request: Request, work: Awaitable):
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise ClientDisconnected


def _observe_stages(omni: AsyncOmniLLM, metrics: OmniMetrics) -> None:
    omni.engine.timing_listeners.append(metrics.observe_stage)
    for name, stage in omni.engine.stages.items():
        if stage.engine_type == "DiT":
            stage.step_listeners.append(metrics.step_seconds.labels(name).observe)


def _png_b64(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


CLIENT_ERRORS = (ValueError, VLLMClientError)
"""A request's fault: HTTP 400 (`_client_error`)."""


def _is_client_error(error: object) -> bool:
    return isinstance(error, CLIENT_ERRORS)


def _client_error(error: Exception) -> JSONResponse:
    """A 400 for a request's fault: our ValueErrors name their field first; vLLM's validation
    errors (raised in the engine, e.g. out-of-vocabulary `stop_token_ids`) carry it."""
    if isinstance(error, VLLMValidationError) and error.parameter:
        return _bad_request(f"{error.parameter}: {error.args[0]}", error.parameter)
    return _bad_request(str(error), _field_of(str(error)))


def _field_of(message: str) -> str | None:
    head = message.split(":", 1)[0]
    return head if head and " " not in head else None


def _bad_request(message: str, param: str | None) -> JSONResponse:
    return JSONResponse(error_body(message, param), status_code=400)


def run_server(config: ServerConfig, host: str | None, port: int, log_level: str = "info") -> None:
    import uvicorn

    uvicorn.run(build_app(config), host=host or "0.0.0.0", port=port, log_level=log_level)
