# SPDX-License-Identifier: Apache-2.0
"""The call loop on the tiny Stable Diffusion 3.5 (no engine): requests that join a running
batch at a step boundary, with other seeds, step counts, guidance and sizes, each equal the
pipeline's own call alone; their denoiser calls share forwards; a released request's run
unwinds; a request whose pipeline call raises fails alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.call_loop import CALL, CallLoopExecutor
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.request_call import Paused
from vllm_omni.diffusion.scheduler import DiTSchedulerOutput
from vllm_omni.models.diffusers_pipeline.calls import ImagePipelineCalls

from ..helpers.diffusers_reference import pipeline_image


@pytest.fixture(scope="module")
def pipe(tiny_models):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(tiny_models["sd3"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


class RowCounter:
    """Counts the rows of each forward of a module (a forward pre-hook)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.rows: list[int] = []
        self.handle = module.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        self.rows.append(kwargs["hidden_states"].shape[0])


def request(rid: str, prompt: str, **params) -> DiTRequest:
    p = DiffusionSamplingParams(**{"height": 64, "width": 64, **params})
    return DiTRequest(rid, p, {"prompt": prompt})


def test_requests_join_at_a_step_and_equal_the_pipelines_own(pipe):
    cache = DiTCacheManager()
    loop = CallLoopExecutor(DiTConfig(model="."), cache, ImagePipelineCalls(pipe))
    requests = {
        "a": request("a", "a red cat", num_inference_steps=4, seed=0),
        "b": request("b", "a lighthouse", num_inference_steps=2, seed=1, guidance_scale=5.0),
        "c": request("c", "two apples", num_inference_steps=2, seed=2, negative_prompt="dark"),
        "d": request("d", "a tall tree", num_inference_steps=2, seed=3, height=48, width=80),
    }
    counter = RowCounter(pipe.transformer)
    try:
        finished, new, step = {}, ["a"], 0
        while len(finished) < len(requests):
            if step == 1:
                new = ["b", "c", "d"]  # join "a" at its second step
            running = [rid for rid in requests if rid not in finished and (rid == "a" or step)]
            out = loop.execute_model(DiTSchedulerOutput("step", new, [running]), requests)
            assert not out.failed
            finished.update(out.finished)
            new, step = [], step + 1
    finally:
        counter.handle.remove()
    # "a" alone (2 rows: guided), then a + b + c in one forward (6 rows), d (other size) apart
    assert counter.rows[:3] == [2, 6, 2]
    for rid, r in requests.items():
        theirs = pipeline_image(pipe, r.inputs["prompt"], r.params)
        assert finished[rid].shape == theirs.shape
        assert np.abs(finished[rid].astype(int) - theirs.astype(int)).max() <= 2, rid
    assert cache.num_entries == 4  # released by the scheduler, not the executor


def test_a_released_request_unwinds_and_a_failing_one_fails_alone(pipe):
    cache = DiTCacheManager()
    loop = CallLoopExecutor(DiTConfig(model="."), cache, ImagePipelineCalls(pipe))
    requests = {
        "ok": request("ok", "a red cat", num_inference_steps=2, seed=0),
        "gone": request("gone", "a boat", num_inference_steps=3, seed=1),
        # the pipeline itself refuses it (its check_inputs), after the stage admitted it
        "bad": request("bad", "a dog", num_inference_steps=2, seed=2, height=60),
    }
    out = loop.execute_model(DiTSchedulerOutput("step", list(requests), [list(requests)]), requests)
    assert list(out.failed) == ["bad"] and "60" in str(out.failed["bad"])
    run = cache.get("gone").state[CALL]
    cache.release("gone")
    assert run.paused is Paused.CANCELLED and not run.finished
    out = loop.execute_model(DiTSchedulerOutput("step", [], [["ok"]]), requests)
    assert list(out.finished) == ["ok"] and not out.failed
