# SPDX-License-Identifier: Apache-2.0
"""What the omni server's routes share: the server's state as routes see it (`OmniServer`),
client disconnects, a request's events, and errors in OpenAI's shape (400 naming the field)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from vllm.exceptions import VLLMClientError, VLLMValidationError

from vllm_omni.config.stage_config import StageGraph
from vllm_omni.engine.request_run import StageEvent
from vllm_omni.entrypoints.async_omni_llm import AsyncOmniLLM
from vllm_omni.entrypoints.openai.metrics import OmniMetrics
from vllm_omni.entrypoints.openai.protocol import error_body
from vllm_omni.errors import FieldError

DISCONNECT_POLL_S = 0.5


@dataclass
class OmniServer:
    """What a route adapter (vllm_omni.entrypoints.openai.images, a family's `api`) is given:
    the server's settings, its metrics, the stage graph, and the AsyncOmniLLM once started."""

    config: Any  # api_server.ServerConfig
    metrics: OmniMetrics
    graph: StageGraph
    omni: AsyncOmniLLM | None = None
    schema_extras: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    """What the routes add to the published OpenAPI schema (limits JSON schema cannot state),
    applied in place once the stages are up."""
    shutdown_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """What the routes end when the server stops, before the stages stop (e.g. video jobs)."""

    @property
    def model_name(self) -> str:
        return self.config.served_model_name


class ClientDisconnected(Exception):
    pass


async def cancel_on_disconnect(request: Request, work: Awaitable):
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise ClientDisconnected


async def gather_or_cancel(*jobs: Awaitable) -> list:
    """`asyncio.gather` of `jobs`, except that the first failure cancels the others before it
    is raised: the images of one request that can no longer succeed stop taking DiT steps."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def next_output(events: asyncio.Queue):
    """The next text delta, final output or error of a request (stage start/finish events are
    skipped)."""
    while True:
        event = await events.get()
        if not isinstance(event, StageEvent):
            return event


class OutputQueue:
    """`events` without the stage start/finish events."""

    def __init__(self, events: asyncio.Queue) -> None:
        self.events = events

    async def get(self):
        return await next_output(self.events)


CLIENT_ERRORS = (ValueError, VLLMClientError)
"""A request's fault: HTTP 400 (`_client_error`)."""


def is_client_error(error: object) -> bool:
    return isinstance(error, CLIENT_ERRORS)


def client_error(error: Exception) -> JSONResponse:
    """A 400 for a request's fault, `param` naming the field: a FieldError's, or the parameter
    of vLLM's validation errors (raised in the engine, e.g. out-of-vocabulary
    `stop_token_ids`)."""
    if isinstance(error, VLLMValidationError) and error.parameter:
        return bad_request(f"{error.parameter}: {error.args[0]}", error.parameter)
    return bad_request(str(error), error.field if isinstance(error, FieldError) else None)


def bad_request(message: str, param: str | None) -> JSONResponse:
    return JSONResponse(error_body(message, param), status_code=400)
