# SPDX-License-Identifier: Apache-2.0
"""AsyncOmniLLM on the caller's event loop: stage progress, and cancellation in every stage."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from vllm_omni import AsyncOmniLLM, DiffusionSamplingParams
from vllm_omni.engine.process_stage import ProcessStageError
from vllm_omni.engine.request_run import StageEvent
from vllm_omni.entrypoints.async_omni_llm import RequestFinished

pytestmark = pytest.mark.engine


async def _scenario(model) -> None:
    omni = await AsyncOmniLLM.create(
        model, stage_overrides={"text_encoder": {"engine_args": {"enforce_eager": True}}}
    )
    try:
        params = DiffusionSamplingParams(height=64, width=64, num_inference_steps=2, seed=4)
        events = [e async for e in omni.stream("a cat", params, request_id="r1")]
        progress = [(e.stage, e.status) for e in events if isinstance(e, StageEvent)]
        assert progress == [
            ("text_encoder", "started"),
            ("text_encoder", "finished"),
            ("dit", "started"),
            ("dit", "finished"),
        ]
        assert isinstance(events[-1], RequestFinished)
        assert events[-1].output.images[0].size == (64, 64)
        same = await omni.generate("a cat", params)
        assert np.array_equal(np.asarray(same.images[0]), np.asarray(events[-1].output.images[0]))

        # Cancelling the awaiting task cancels the request in every stage.
        slow = DiffusionSamplingParams(height=64, width=64, num_inference_steps=1000, seed=1)
        task = asyncio.create_task(omni.generate("slow", slow, request_id="slow"))
        for _ in range(600):
            if (await omni.stats())["dit"]["cache_entries"] == 1:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the request never reached the DiT stage")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = await omni.stats()
        assert stats["dit"]["cache_entries"] == 0 and stats["dit"]["num_running"] == 0
        assert stats["requests"]["aborted"] == 1 and stats["requests"]["running"] == 0

        # A DiT process that dies fails the requests it held (no hang) and shows as dead.
        assert omni.engine.dead_stages() == []
        doomed = asyncio.create_task(omni.generate("doomed", slow))
        await asyncio.sleep(1.0)
        os.kill(omni.engine.stages["dit"].pid, signal.SIGKILL)
        with pytest.raises(ProcessStageError, match="process died"):
            await asyncio.wait_for(doomed, 30)
        assert omni.engine.dead_stages() == ["dit"]
    finally:
        omni.shutdown()


def test_stream_and_cancel(tiny_models) -> None:
    asyncio.run(_scenario(tiny_models["qwen-image"]))
