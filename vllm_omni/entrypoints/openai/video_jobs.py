# SPDX-License-Identifier: Apache-2.0
"""Video jobs: requests that take minutes, run apart from the HTTP connection that made them.

A job is created validated (`AsyncOmniLLM.prepare` has accepted it) and runs as a task of the
server's event loop: queued until its stage takes it, in progress with the stage's per-step
progress, then completed (its MP4 on disk) or failed (saying why). Deleting a job cancels it
wherever it is, which aborts it in its stage and frees its DiT state. Finished jobs expire
`ttl_s` after they finish; when a new video would push the results past `max_bytes` on disk,
the oldest finished jobs expire first. At most `max_pending` jobs are queued or running.

The MP4s and the jobs' records (SQLite: video_records.py) live in `folder`. Given one
(`--video-dir`), they outlive the server: started again on it, a server lists and serves the
videos finished before, within their TTL, and the jobs that were queued or running when it
stopped come back failed, saying so. Without one, a temporary folder, removed at shutdown.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_omni.engine.request_run import StageDelta, StageEvent
from vllm_omni.entrypoints.async_omni_llm import AsyncOmniLLM
from vllm_omni.entrypoints.openai.video_records import COLUMNS, VideoRecords
from vllm_omni.logger import init_logger
from vllm_omni.video_file import encode_mp4

logger = init_logger(__name__)

QUEUED, IN_PROGRESS, COMPLETED, FAILED = "queued", "in_progress", "completed", "failed"
STOPPED = {
    "code": "server_stopped",
    "message": "the server stopped before this job finished; create it again",
}
"""The error of a job that was queued or running when its server stopped."""


class TooManyJobs(Exception):
    pass


@dataclass
class VideoJob:
    """One job, as OpenAI's Video object describes it (`as_dict`)."""

    id: str
    model: str
    prompt: str
    size: str
    seconds: str
    created_at: int
    status: str = QUEUED
    progress: int = 0
    completed_at: int | None = None
    expires_at: int | None = None
    error: dict[str, str] | None = None
    path: Path | None = None
    num_bytes: int = 0
    task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in (COMPLETED, FAILED)

    def record(self) -> dict[str, Any]:
        """What outlives the server (VideoRecords' columns)."""
        return {name: getattr(self, name) for name in COLUMNS}

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": self.status,
            "progress": self.progress,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "expires_at": self.expires_at,
            "error": self.error,
            "prompt": self.prompt,
            "seconds": self.seconds,
            "size": self.size,
            "remixed_from_video_id": None,
        }


class VideoJobs:
    def __init__(
        self,
        omni: AsyncOmniLLM,
        *,
        ttl_s: float,
        max_bytes: int,
        max_pending: int,
        is_client_error: Callable[[Exception], bool],
        clock: Callable[[], float] = time.time,
        folder: Path | None = None,
    ) -> None:
        self.omni = omni
        self.ttl_s, self.max_bytes, self.max_pending = ttl_s, max_bytes, max_pending
        self.is_client_error = is_client_error
        self.clock = clock
        self.durable = folder is not None
        if folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="vllm_omni_videos_"))
        else:
            self.folder = Path(folder)
            self.folder.mkdir(parents=True, exist_ok=True)
        self.records = VideoRecords(self.folder)
        self.jobs: dict[str, VideoJob] = {}  # in creation order
        self._restore()

    def _restore(self) -> None:
        """The jobs of an earlier run on this folder: unfinished ones failed, saying so;
        completed ones whose MP4 is gone and expired ones dropped."""
        for record in self.records.rows():
            job = VideoJob(**record)
            if not job.finished:
                self._finish(job, FAILED, error=STOPPED)
            if job.status == COMPLETED and (job.path is None or not job.path.is_file()):
                self.records.delete(job.id)
                continue
            self.jobs[job.id] = job
        self.expire()

    # ------------------------------------------------------------------ the API's verbs
    def create(self, model: str, prompt: str, size: str, seconds: str, prepared: tuple) -> VideoJob:
        """Start a job for a request `AsyncOmniLLM.prepare` accepted (`prepared`)."""
        self.expire()
        pending = sum(not job.finished for job in self.jobs.values())
        if pending >= self.max_pending:
            raise TooManyJobs(
                f"{pending} video jobs are queued or running, the most this server takes "
                "(--max-video-jobs); retry when one has finished"
            )
        job = VideoJob(f"video_{uuid.uuid4().hex}", model, prompt, size, seconds, int(self.clock()))
        self.jobs[job.id] = job
        self.records.save(job.record())
        job.task = asyncio.create_task(self._run(job, *prepared), name=job.id)
        return job

    def get(self, job_id: str) -> VideoJob | None:
        self.expire()
        return self.jobs.get(job_id)

    def list(self, after: str | None, limit: int, newest_first: bool) -> tuple[list, bool]:
        """A page of jobs after the one named `after` (None: from the first); whether more
        follow. KeyError if `after` is no job's id."""
        self.expire()
        jobs = list(self.jobs.values())
        if newest_first:
            jobs.reverse()
        if after is not None:
            ids = [job.id for job in jobs]
            if after not in ids:
                raise KeyError(after)
            jobs = jobs[ids.index(after) + 1 :]
        return jobs[:limit], len(jobs) > limit

    async def delete(self, job_id: str) -> bool:
        """Cancel the job if it runs (its stage aborts it and frees its state), remove its video;
        False if there is no such job."""
        self.expire()
        job = self.jobs.pop(job_id, None)
        if job is None:
            return False
        await self._end(job)
        return True

    # ------------------------------------------------------------------ running
    async def _run(self, job: VideoJob, inputs: dict, params: dict) -> None:
        def on_event(event: StageEvent | StageDelta) -> None:
            if isinstance(event, StageEvent) and event.status == "started":
                job.status = IN_PROGRESS
                self.records.save(job.record())
            elif isinstance(event, StageDelta) and "progress" in event.data:
                job.status = IN_PROGRESS  # 100 only once the file is written
                job.progress = min(99, int(event.data["progress"] * 100))

        try:
            output = await self.omni.run_prepared(inputs, params, job.id, on_event)
            data = await asyncio.to_thread(encode_mp4, output.video, output.fps)
            self._store(job, data)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not self.is_client_error(e):
                logger.exception("video job %s failed", job.id)
            code = "invalid_request" if self.is_client_error(e) else "internal_error"
            self._finish(job, FAILED, error={"code": code, "message": str(e)})

    def _store(self, job: VideoJob, data: bytes) -> None:
        if len(data) > self.max_bytes:
            message = (
                f"the video is {len(data)} bytes, more than this server keeps "
                f"(--max-video-storage-mb: {self.max_bytes} bytes)"
            )
            self._finish(job, FAILED, error={"code": "storage_limit", "message": message})
            return
        self._make_room(len(data))
        path = self.folder / f"{job.id}.mp4"
        path.write_bytes(data)
        job.path, job.num_bytes = path, len(data)
        job.progress = 100
        self._finish(job, COMPLETED)

    def _finish(self, job: VideoJob, status: str, error: dict | None = None) -> None:
        now = int(self.clock())
        job.status, job.error = status, error
        job.completed_at = now
        job.expires_at = now + int(self.ttl_s)
        self.records.save(job.record())

    def _make_room(self, num_bytes: int) -> None:
        """Expire the oldest finished videos until `num_bytes` more fit."""
        stored = sorted(
            (job for job in self.jobs.values() if job.path is not None),
            key=lambda job: job.completed_at or 0,
        )
        used = sum(job.num_bytes for job in stored)
        for job in stored:
            if used + num_bytes <= self.max_bytes:
                break
            used -= job.num_bytes
            self._remove(job)

    # ------------------------------------------------------------------ ending
    def expire(self) -> None:
        """Drop finished jobs past their expiry time, with their videos."""
        now = self.clock()
        for job in [j for j in self.jobs.values() if j.expires_at and j.expires_at <= now]:
            self._remove(job)

    def _remove(self, job: VideoJob) -> None:
        self.jobs.pop(job.id, None)
        self.records.delete(job.id)
        if job.path is not None:
            job.path.unlink(missing_ok=True)
            job.path = None

    async def _end(self, job: VideoJob) -> None:
        if job.task is not None and not job.task.done():
            job.task.cancel()
            await asyncio.gather(job.task, return_exceptions=True)
        self._remove(job)

    async def shutdown(self) -> None:
        """Cancel the jobs in flight; keep the finished ones where the folder is the user's
        (the cancelled ones recorded as failed: the server stopped), else remove it all."""
        for job in list(self.jobs.values()):
            if not self.durable:
                await self._end(job)
            elif job.task is not None and not job.task.done():
                job.task.cancel()
                await asyncio.gather(job.task, return_exceptions=True)
                self._finish(job, FAILED, error=STOPPED)
        self.jobs.clear()
        self.records.close()
        if not self.durable:
            shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def stored_bytes(self) -> int:
        return sum(job.num_bytes for job in self.jobs.values() if job.path is not None)
