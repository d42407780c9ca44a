# SPDX-License-Identifier: Apache-2.0
"""Running one route's requests of a prompt through the stage graph (one per parameter set),
with OpenAI's errors: a 400 naming the field for bad input, 429 for a deadline the stage cannot
meet, 499 when the client goes, 500 naming the failure of a stage; every outcome counted."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from vllm_omni.diffusion.deadline import DeadlineUnreachable
from vllm_omni.entrypoints.openai.protocol import error_body
from vllm_omni.entrypoints.openai.server_utils import (
    ClientDisconnected,
    OmniServer,
    cancel_on_disconnect,
    client_error,
    gather_or_cancel,
)
from vllm_omni.logger import init_logger

logger = init_logger(__name__)


async def run_requests(
    server: OmniServer, endpoint: str, request: Request, prompt: dict, params: list[Any]
) -> tuple[list | None, Response | None]:
    """Run `prompt` once per parameter set, together; returns (outputs, None) or (None, the
    error response). All are checked before any runs."""
    omni = server.omni
    try:
        prepared = [omni.prepare(prompt, p) for p in params]
    except ValueError as e:
        server.metrics.requests.labels(endpoint, "rejected").inc()
        return None, client_error(e)
    jobs = [omni.run_prepared(*x) for x in prepared]
    try:
        return await cancel_on_disconnect(request, gather_or_cancel(*jobs)), None
    except ClientDisconnected:
        server.metrics.requests.labels(endpoint, "cancelled").inc()
        return None, Response(status_code=499)
    except asyncio.CancelledError:  # the server cancelled the handler (client gone)
        server.metrics.requests.labels(endpoint, "cancelled").inc()
        raise
    except DeadlineUnreachable as e:  # admission control: come back later
        server.metrics.requests.labels(endpoint, "overloaded").inc()
        body = error_body(str(e), "latency_slo_ms", kind="rate_limit_exceeded", code=429)
        return None, JSONResponse(body, 429)
    except ValueError as e:
        server.metrics.requests.labels(endpoint, "rejected").inc()
        return None, client_error(e)
    except Exception as e:  # a stage failed: report it, keep serving
        logger.exception("%s request failed", endpoint)
        server.metrics.requests.labels(endpoint, "failed").inc()
        return None, JSONResponse(error_body(str(e), kind="internal_error", code=500), 500)
