# SPDX-License-Identifier: Apache-2.0
"""The omni server: OpenAI-compatible endpoints over an AsyncOmniLLM stage graph.

    vllm serve path/to/Qwen-Image --omni        (or: vllm-omni serve path/to/Qwen-Image)

Routes: GET /v1/models, GET /health, GET /metrics, and the routes of what the graph makes -
its model family's API adapter where it has one (vllm_omni.registry), else the server's
own for its outputs (images: POST /v1/images/generations and /v1/chat/completions, images.py;
video: the /v1/videos job API, videos.py; audio made from a prompt: POST /v1/audio/speech,
audio.py).
`--api-key` guards every route. Bad input gets HTTP 400 with an OpenAI-style error body naming
the field; a client that disconnects cancels its request in every stage.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from vllm_omni.config.model_defaults import resolve_stage_graph
from vllm_omni.config.stage_config import StageGraph
from vllm_omni.entrypoints.async_omni_llm import AsyncOmniLLM
from vllm_omni.entrypoints.openai import audio, images, videos
from vllm_omni.entrypoints.openai.metrics import OmniMetrics
from vllm_omni.entrypoints.openai.protocol import error_body
from vllm_omni.entrypoints.openai.server_utils import OmniServer, bad_request
from vllm_omni.logger import init_logger
from vllm_omni.registry import families

logger = init_logger(__name__)

DEFAULT_MAX_PIXELS = 2048 * 2048
DEFAULT_MAX_REQUEST_STEPS = 200
"""n x num_inference_steps of one image request: four images of 50 steps. With the pixel limit
it bounds the work one request can hold the DiT stage with."""
DEFAULT_MAX_VIDEO_FRAMES = 161  # 10 s at Wan's 16 fps
DEFAULT_VIDEO_TTL_S = 3600.0
DEFAULT_MAX_VIDEO_STORAGE_MB = 2048
DEFAULT_MAX_VIDEO_JOBS = 16


@dataclass(frozen=True)
class ServerConfig:
    model: str
    served_model_name: str
    api_keys: tuple[str, ...] = ()
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_request_steps: int = DEFAULT_MAX_REQUEST_STEPS
    max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES
    video_ttl_s: float = DEFAULT_VIDEO_TTL_S
    """Finished video jobs are forgotten (their MP4 deleted) this long after they finish."""
    max_video_storage_mb: int = DEFAULT_MAX_VIDEO_STORAGE_MB
    """Disk the finished videos may take; the oldest expire first to make room."""
    max_video_jobs: int = DEFAULT_MAX_VIDEO_JOBS
    """Video jobs queued or running at once; more are refused (429)."""
    video_dir: str | None = None
    """The folder of finished videos and the jobs' records, kept across restarts (None: a
    temporary one)."""
    shutdown_timeout: float = 0
    """Seconds the requests in flight at SIGTERM (or SIGINT) may take to finish before they are
    cancelled and the stages stop (vLLM's `--shutdown-timeout`; 0: cancelled at once)."""
    graph: StageGraph | None = None
    """The resolved stage graph (`vllm serve` resolves it once); None: resolved from the fields
    below when the app is built."""
    stage_configs: Any = None
    stage_overrides: Mapping[str, Any] | None = None
    revision: str | None = None
    download_dir: str | None = None


class APIKeyMiddleware:
    """The API routes (under /v1) need `Authorization: Bearer <key>`; /health, /metrics and
    the schema stay open for probes and scrapers, as on vLLM's own server. Plain ASGI (not
    Starlette's BaseHTTPMiddleware, which hides the client's disconnect from the endpoint)."""

    def __init__(self, app, api_keys: tuple[str, ...]) -> None:
        self.app = app
        self.api_keys = api_keys

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
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
    server = OmniServer(config, OmniMetrics(), _graph(config, omni), omni)
    app = FastAPI(title="vllm-omni", lifespan=functools.partial(_lifespan, server=server))
    if config.api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=config.api_keys)
    _add_error_handlers(app)
    _add_common_routes(app, server)
    _add_routes(app, server)
    app.openapi = functools.partial(_openapi, app, server)
    return app


def _graph(config: ServerConfig, omni: AsyncOmniLLM | None) -> StageGraph:
    if omni is not None:
        return omni.graph
    if config.graph is not None:
        return config.graph
    return resolve_stage_graph(
        config.model,
        config.stage_configs,
        config.stage_overrides,
        revision=config.revision,
        download_dir=config.download_dir,
    )


@asynccontextmanager
async def _lifespan(app: FastAPI, server: OmniServer):
    if server.omni is None:
        server.omni = await AsyncOmniLLM.create(stage_configs=server.graph)
    server.omni.observe(server.metrics.observe_stage, server.metrics.observe_step)
    logger.info(
        "omni server ready: %s (stages %s)", server.model_name, ", ".join(server.graph.names)
    )
    try:
        yield
    finally:
        for hook in server.shutdown_hooks:
            await hook()
        server.omni.shutdown()


def _openapi(app: FastAPI, server: OmniServer) -> dict[str, Any]:
    """FastAPI's schema plus what JSON schema cannot state (the routes' own limits, added by
    their adapters: `server.schema_extras`). FastAPI builds it on the first GET /openapi.json,
    after startup, when the graph's stages are up."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)  # builds and caches app.openapi_schema
        _integer_bounds(schema)
        for add_extras in server.schema_extras:
            add_extras(schema)
    return app.openapi_schema


def _add_error_handlers(app: FastAPI) -> None:
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
            return bad_request(f"the body is not valid JSON: {error}".rstrip(": "), None)
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(loc) or None
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        return bad_request(f"{param}: {message}" if param else message, param)


def _add_common_routes(app: FastAPI, server: OmniServer) -> None:
    """Routes every graph has: health, models, metrics."""

    @app.get("/health")
    async def health() -> Response:
        dead = server.omni.dead_stages()
        if dead:
            message = f"stage(s) {', '.join(dead)} stopped; restart the server"
            return JSONResponse(error_body(message, kind="service_unavailable", code=503), 503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        model = {
            "id": server.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm-omni",
            "root": server.config.model,
        }
        return {"object": "list", "data": [model]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        server.metrics.update_from_stats(await server.omni.stats())
        body = generate_latest(server.metrics.registry) + generate_latest(REGISTRY)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


def _add_routes(app: FastAPI, server: OmniServer) -> None:
    """The routes of what the graph makes: its family's adapter where it has one, else the
    server's own for its output modalities (images, videos, audio)."""
    family = families().get(server.graph.model_type or "")
    if family is not None and family.api is not None:
        family.api(app, server)
    elif "image" in server.graph.output_modalities:
        images.add_routes(app, server)
    elif "video" in server.graph.output_modalities:
        videos.add_routes(app, server)
    elif "audio" in server.graph.output_modalities:
        audio.add_routes(app, server)


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


def run_server(config: ServerConfig, host: str | None, port: int, log_level: str = "info") -> None:
    """Serve until SIGTERM or SIGINT: then no new connection is taken, the requests in flight
    get `config.shutdown_timeout` seconds to finish (uvicorn's graceful shutdown), and the
    stages stop (the lifespan's end)."""
    import uvicorn

    uvicorn.run(
        build_app(config),
        host=host or "0.0.0.0",
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=config.shutdown_timeout,
    )
