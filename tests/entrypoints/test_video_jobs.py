# SPDX-License-Identifier: Apache-2.0
"""The video job store without an engine: a stand-in for AsyncOmniLLM makes the frames, a fake
clock drives expiry. Jobs complete into MP4 files, fail saying why, are cancelled by delete,
expire after their TTL, give way (oldest first) to newer videos past the disk budget, and are
refused beyond the pending limit."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from vllm_omni.engine.request_run import StageDelta, StageEvent
from vllm_omni.entrypoints.openai.video_jobs import TooManyJobs, VideoJob, VideoJobs
from vllm_omni.errors import FieldError
from vllm_omni.outputs import OmniRequestOutput
from vllm_omni.video_file import decode_mp4


class FakeOmni:
    """Runs a request as the engine would report it: started, two steps of progress, output.
    A prompt of "fail" raises; "hang" waits until cancelled."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def run_prepared(self, inputs, params, request_id, on_event):
        on_event(StageEvent(request_id, "dit", "started", 0.0))
        if inputs["prompt"] == "hang":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(request_id)
                raise
        if inputs["prompt"] == "fail":
            raise FieldError("seed", "bad seed")
        for step in (1, 2):
            on_event(StageDelta(request_id, "dit", {"progress": step / 2}, 0.0))
        frames = np.full((5, 16, 16, 3), params["shade"], dtype=np.uint8)
        return OmniRequestOutput(request_id, inputs["prompt"], video=frames, fps=8.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(clock=None, **kw) -> tuple[VideoJobs, FakeOmni]:
    omni = FakeOmni()
    settings = {"ttl_s": 60, "max_bytes": 10**6, "max_pending": 4, **kw}
    jobs = VideoJobs(
        omni,
        is_client_error=lambda e: isinstance(e, ValueError),
        clock=clock or Clock(),
        **settings,
    )
    return jobs, omni


def make(jobs: VideoJobs, prompt: str = "a cat", shade: int = 100):
    return jobs.create("m", prompt, "16x16", "0.6", ({"prompt": prompt}, {"shade": shade}))


async def finish(job) -> None:
    await asyncio.gather(job.task, return_exceptions=True)


def test_a_job_completes_into_an_mp4() -> None:
    async def run():
        jobs, _ = store()
        job = make(jobs)
        assert job.as_dict()["status"] == "queued" and job.as_dict()["object"] == "video"
        await finish(job)
        frames, fps = decode_mp4(job.path.read_bytes())
        body = job.as_dict()
        await jobs.shutdown()
        return frames, fps, body, jobs.folder.exists()

    frames, fps, body, folder_left = asyncio.run(run())
    assert frames.shape == (5, 16, 16, 3) and fps == 8.0
    assert abs(int(frames.mean()) - 100) <= 2
    assert body["status"] == "completed" and body["progress"] == 100
    assert body["expires_at"] == body["completed_at"] + 60
    assert not folder_left  # shutdown removes the videos


def test_a_failed_job_says_why() -> None:
    async def run():
        jobs, _ = store()
        job = make(jobs, "fail")
        await finish(job)
        return job.as_dict()

    body = asyncio.run(run())
    assert body["status"] == "failed"
    assert body["error"] == {"code": "invalid_request", "message": "seed: bad seed"}


def test_delete_cancels_a_running_job() -> None:
    async def run():
        jobs, omni = store()
        job = make(jobs, "hang")
        await asyncio.sleep(0.01)
        assert job.status == "in_progress"
        assert await jobs.delete(job.id)
        return jobs, omni, job

    jobs, omni, job = asyncio.run(run())
    assert omni.cancelled == [job.id] and jobs.get(job.id) is None


def test_finished_jobs_expire_after_the_ttl() -> None:
    async def run():
        clock = Clock()
        jobs, _ = store(clock)
        job = make(jobs)
        await finish(job)
        clock.now += 59
        kept = jobs.get(job.id) is not None
        clock.now += 2
        return kept, jobs.get(job.id), job.path

    kept, gone, path = asyncio.run(run())
    assert kept and gone is None and path is None


def test_the_oldest_videos_make_room_past_the_disk_budget() -> None:
    async def run():
        clock = Clock()
        probe, _ = store(clock)
        one = make(probe)
        await finish(one)
        size = one.num_bytes
        jobs, _ = store(clock, max_bytes=2 * size + size // 2)  # room for two
        made = []
        for shade in (10, 20, 30):
            made.append(make(jobs, shade=shade))
            await finish(made[-1])
            clock.now += 1
        return [jobs.get(job.id) is not None for job in made], jobs.stored_bytes, 2 * size

    kept, stored, budget = asyncio.run(run())
    assert kept == [False, True, True] and stored <= budget + budget // 4


def test_a_video_over_the_whole_budget_fails_saying_so() -> None:
    async def run():
        jobs, _ = store(max_bytes=100)
        job = make(jobs)
        await finish(job)
        return job.as_dict()

    body = asyncio.run(run())
    assert body["status"] == "failed" and body["error"]["code"] == "storage_limit"
    assert "--max-video-storage-mb" in body["error"]["message"]


def test_more_pending_jobs_than_the_limit_are_refused() -> None:
    async def run():
        jobs, _ = store(max_pending=2)
        running = [make(jobs, "hang") for _ in range(2)]
        with pytest.raises(TooManyJobs, match="--max-video-jobs"):
            make(jobs)
        await jobs.delete(running[0].id)
        make(jobs)  # room again
        page, more = jobs.list(None, 1, newest_first=True)
        await jobs.shutdown()
        return page, more, running

    page, more, running = asyncio.run(run())
    assert more and page[0].id not in {job.id for job in running}


def test_a_restarted_server_serves_the_videos_finished_before(tmp_path) -> None:
    """On a video folder of its own (`--video-dir`), a store started again lists and serves the
    jobs that finished, failed ones included; the job running at shutdown and the one a killed
    server left queued come back failed, saying the server stopped; expired ones are gone."""
    clock = Clock()

    async def first_run():
        jobs, _ = store(clock, folder=tmp_path)
        done, failed = make(jobs, shade=50), make(jobs, "fail")
        await finish(done)
        await finish(failed)
        running = make(jobs, "hang")
        await asyncio.sleep(0.01)
        await jobs.shutdown()
        return done, failed, running

    done, failed, running = asyncio.run(first_run())
    # A server killed with a job queued: its record says queued (written before it ran).
    killed, _ = store(clock, folder=tmp_path)
    queued = VideoJob("video_lost", "m", "a dog", "16x16", "0.6", int(clock.now))
    killed.records.save(queued.record())
    killed.records.close()
    clock.now += 30

    async def second_run():
        jobs, _ = store(clock, folder=tmp_path)
        listed, _ = jobs.list(None, 10, newest_first=False)
        return jobs, {job.id: job.as_dict() for job in listed}, jobs.get(done.id)

    jobs, listed, again = asyncio.run(second_run())
    assert list(listed) == [done.id, failed.id, running.id, "video_lost"]
    assert listed[done.id]["status"] == "completed" and listed[done.id]["progress"] == 100
    mp4 = again.path
    frames, _ = decode_mp4(mp4.read_bytes())
    assert abs(int(frames.mean()) - 50) <= 2
    assert listed[failed.id]["error"]["message"] == "seed: bad seed"
    for stopped in (running.id, "video_lost"):
        assert listed[stopped]["status"] == "failed"
        assert listed[stopped]["error"]["code"] == "server_stopped", listed[stopped]
    clock.now += 61  # past every TTL: the jobs and their MP4 go
    assert jobs.list(None, 10, newest_first=False)[0] == []
    assert not mp4.exists()
    assert tmp_path.is_dir()  # the user's folder stays
