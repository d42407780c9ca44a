# SPDX-License-Identifier: Apache-2.0
"""The routes of a graph whose output is video, in the shape of OpenAI's videos API: jobs.

    POST   /v1/videos                  create a job (multipart form, video_protocol.py); at once
    GET    /v1/videos                  list jobs (after, limit, order: newest first by default)
    GET    /v1/videos/{id}             the job: status, progress 0-100, error
    GET    /v1/videos/{id}/content     its MP4 once completed (409 before, 404 once gone)
    DELETE /v1/videos/{id}             cancel it wherever it is and forget it

Jobs run apart from the connection that made them (video_jobs.py). A bad form is a 400 naming
the field, before any job exists; a full queue is a 429.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException

from vllm_omni.diffusion.executor_kind import VideoStageInfo
from vllm_omni.diffusion.params import INPUT_IMAGES
from vllm_omni.diffusion.video_params import VideoSamplingParams
from vllm_omni.entrypoints.openai.protocol import error_body
from vllm_omni.entrypoints.openai.server_utils import OmniServer, client_error, is_client_error
from vllm_omni.entrypoints.openai.uploads import decode_image, form_body
from vllm_omni.entrypoints.openai.video_jobs import COMPLETED, TooManyJobs, VideoJobs
from vllm_omni.entrypoints.openai.video_protocol import VideoCreateRequest
from vllm_omni.errors import FieldError

FILE_FIELD = "input_reference"
FORM_FIELD = {INPUT_IMAGES: FILE_FIELD, "height": "size", "width": "size"}
"""The form field that carries a parameter the stage names."""
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")  # the latter: no file
MAX_IMAGE_BYTES = 16 * 2**20
MAX_FIELDS = 64
MAX_LIST = 100
POLL_AFTER_MS = 200


class _JobStore:
    """The server's VideoJobs, made on first use (the stages are up by then)."""

    def __init__(self, server: OmniServer) -> None:
        self.server = server
        self.jobs: VideoJobs | None = None

    def __call__(self) -> VideoJobs:
        if self.jobs is None:
            config = self.server.config
            self.jobs = VideoJobs(
                self.server.omni,
                ttl_s=config.video_ttl_s,
                max_bytes=config.max_video_storage_mb * 2**20,
                max_pending=config.max_video_jobs,
                is_client_error=is_client_error,
                folder=Path(config.video_dir) if config.video_dir else None,
            )
        return self.jobs

    async def shutdown(self) -> None:
        if self.jobs is not None:
            await self.jobs.shutdown()


def add_routes(app: FastAPI, server: OmniServer) -> None:
    server.schema_extras.append(lambda schema: _schema_limits(schema, server))
    jobs = _JobStore(server)
    server.shutdown_hooks.append(jobs.shutdown)

    @app.post("/v1/videos", openapi_extra={"requestBody": _request_body()})
    async def create(request: Request):
        try:
            body, image = await _read_form(request, server.config.max_pixels)
            stage, info = _video_stage(server)
            inputs, by_stage = _prepare(server, body, info, image)
            resolved = by_stage[stage]
            _check_limits(resolved, server)
            job = jobs().create(
                server.model_name,
                body.prompt,
                f"{resolved.width}x{resolved.height}",
                body.seconds or f"{resolved.num_frames / resolved.fps:g}",
                (inputs, by_stage),
            )
        except TooManyJobs as e:
            server.metrics.requests.labels("videos", "overloaded").inc()
            return JSONResponse(error_body(str(e), kind="rate_limit_exceeded", code=429), 429)
        except ValueError as e:
            server.metrics.requests.labels("videos", "rejected").inc()
            return client_error(e)
        server.metrics.requests.labels("videos", "created").inc()
        return job.as_dict()

    @app.get("/v1/videos")
    async def list_videos(
        after: str | None = None,
        limit: int = Query(20, ge=1, le=MAX_LIST),
        order: Literal["asc", "desc"] = "desc",
    ):
        try:
            page, more = jobs().list(after, limit, newest_first=order == "desc")
        except KeyError:
            return _not_found(after, "after")
        return {
            "object": "list",
            "data": [job.as_dict() for job in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": more,
        }

    @app.get("/v1/videos/{video_id}")
    async def retrieve(video_id: str):
        job = jobs().get(video_id)
        if job is None:
            return _not_found(video_id)
        # The official client's create_and_poll waits this long between polls (default: 1 s).
        headers = {} if job.finished else {"openai-poll-after-ms": str(POLL_AFTER_MS)}
        return JSONResponse(job.as_dict(), headers=headers)

    @app.get("/v1/videos/{video_id}/content")
    async def content(video_id: str, variant: str = "video"):
        if variant != "video":
            message = f"variant: only 'video' is served, not {variant!r}"
            return JSONResponse(error_body(message, "variant"), 400)
        job = jobs().get(video_id)
        if job is None:
            return _not_found(video_id)
        if job.status != COMPLETED or job.path is None:
            why = f": {job.error['message']}" if job.error else ""
            message = (
                f"video {video_id!r} is {job.status} ({job.progress}%){why}; its content is "
                "there once its status is completed"
            )
            return JSONResponse(error_body(message, "video_id", code=409), 409)
        return FileResponse(job.path, media_type="video/mp4", filename=f"{video_id}.mp4")

    @app.delete("/v1/videos/{video_id}")
    async def delete(video_id: str):
        if not await jobs().delete(video_id):
            return _not_found(video_id)
        server.metrics.requests.labels("videos", "deleted").inc()
        return {"id": video_id, "object": "video.deleted", "deleted": True}


def _not_found(video_id: str | None, param: str = "video_id") -> JSONResponse:
    message = f"no video job {video_id!r} (never made, deleted, or expired)"
    return JSONResponse(error_body(message, param, code=404), 404)


def _video_stage(server: OmniServer) -> tuple[str, VideoStageInfo]:
    """The stage that makes the video, and what it declares (frame step, rate, experts)."""
    infos = server.omni.stage_info().items()
    return next((name, i) for name, i in infos if isinstance(i, VideoStageInfo))


def _prepare(
    server: OmniServer, body: VideoCreateRequest, info: VideoStageInfo, image: Any
) -> tuple[dict, dict]:
    """The request as `AsyncOmniLLM.prepare` takes it; errors name the form's fields."""
    prompt: dict[str, Any] = {"prompt": body.prompt}
    if image is not None:
        prompt[INPUT_IMAGES] = image
    try:
        return server.omni.prepare(prompt, body.sampling_params(info))
    except FieldError as e:
        if e.field in FORM_FIELD:
            raise FieldError(FORM_FIELD[e.field], e.message) from None
        raise


def _check_limits(params: VideoSamplingParams, server: OmniServer) -> None:
    """The server's own limits on the resolved video: pixels per frame, frames, steps."""
    config = server.config
    if params.height * params.width > config.max_pixels:
        raise FieldError(
            "size",
            f"{params.width}x{params.height} is over {config.max_pixels} pixels "
            "(--max-image-pixels)",
        )
    if params.num_frames > config.max_video_frames:
        raise FieldError(
            "num_frames",
            f"at most {config.max_video_frames} (--max-video-frames), got {params.num_frames}",
        )
    if params.num_inference_steps > config.max_request_steps:
        raise FieldError(
            "num_inference_steps",
            f"at most {config.max_request_steps} (--max-request-steps), got "
            f"{params.num_inference_steps}",
        )


async def _read_form(request: Request, max_pixels: int) -> tuple[VideoCreateRequest, Any]:
    """The form's fields and its first frame (None if not given); FieldError naming what is
    wrong."""
    content_type = request.headers.get("content-type")
    if content_type is not None and not content_type.startswith(FORM_TYPES):
        raise FieldError("body", "send a multipart/form-data form, as OpenAI's videos API takes")
    try:
        form = await request.form(max_files=2, max_fields=MAX_FIELDS, max_part_size=MAX_IMAGE_BYTES)
    except MultiPartException as e:
        raise FieldError("body", f"not a valid multipart form: {e.message}") from None
    fields: dict[str, str] = {}
    upload = None
    for key, value in form.multi_items():  # no content type at all: an empty form
        if key in fields or (key == FILE_FIELD and upload is not None):
            raise FieldError(key, "given twice")
        if key == FILE_FIELD:
            upload = value
        elif isinstance(value, UploadFile):
            raise FieldError(key, "unexpected file field")
        else:
            fields[key] = value
    body = form_body(VideoCreateRequest, fields)
    if upload is None:
        return body, None
    return body, await decode_image(upload, FILE_FIELD, max_pixels, MAX_IMAGE_BYTES)


def _request_body() -> dict[str, Any]:
    fields = VideoCreateRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    image = {"type": "string", "format": "binary", "maxLength": MAX_IMAGE_BYTES}
    schema = {
        "type": "object",
        "properties": {**fields["properties"], FILE_FIELD: image},
        "required": ["prompt"],
        "additionalProperties": False,  # an unknown field is a 400 naming it
    }
    return {"required": True, "content": {"multipart/form-data": {"schema": schema}}}


def _schema_limits(schema: dict[str, Any], server: OmniServer) -> None:
    """This server's limits in the published form: pixels, frames, steps, the size multiple."""
    operation = schema.get("paths", {}).get("/v1/videos", {}).get("post")
    if operation is None:
        return
    form = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    properties = form["properties"]
    config = server.config
    size = {"x-max-pixels": config.max_pixels}
    infos = [i for i in server.omni.stage_info().values() if isinstance(i, VideoStageInfo)]
    frames = {"maximum": config.max_video_frames}
    if infos:
        info = infos[0]
        size["x-size-multiple"] = info.size_multiple
        frames["x-frame-step"] = info.frame_step
        properties[FILE_FIELD]["x-max-pixels"] = config.max_pixels
        if info.image_to_video:
            form["required"] = ["prompt", FILE_FIELD]
        else:
            del properties[FILE_FIELD]
        if info.num_experts < 2:
            del properties["guidance_scale_2"]
    _set(properties["size"], size)
    _set(properties["num_frames"], frames)
    _set(properties["num_inference_steps"], {"maximum": min(1000, config.max_request_steps)})


def _set(field: dict[str, Any], values: dict[str, Any]) -> None:
    """Add `values` to a field's schema, on its non-null branch where it is optional."""
    for branch in field.get("anyOf", [field]):
        if branch.get("type") != "null":
            branch.update(values)
