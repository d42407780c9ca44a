# SPDX-License-Identifier: Apache-2.0
"""DiffusionScheduler and DiTCacheManager without a model: admission, batching, release."""

from __future__ import annotations

import pytest
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheConfig, DiTCacheManager
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiffusionScheduler, DiTRunnerOutput, DiTSchedulerConfig


def _request(rid: str, steps: int = 2, size: int = 64, cfg: bool = False) -> DiTRequest:
    params = DiffusionSamplingParams(
        height=size,
        width=size,
        num_inference_steps=steps,
        seed=0,
        negative_prompt="x" if cfg else None,
    )
    return DiTRequest(rid, params, {"prompt_embeds": torch.zeros(3, 4)})


def _scheduler(mode="step", max_num_seqs=8, max_bytes=None) -> DiffusionScheduler:
    cache = DiTCacheManager(DiTCacheConfig(max_bytes=max_bytes))
    return DiffusionScheduler(DiTSchedulerConfig(mode, max_num_seqs), cache, lambda r: 100)


class FakeRunner:
    """Stands in for the executor: allocates entries for new requests, finishes requests
    whose step count is reached."""

    def __init__(self, scheduler: DiffusionScheduler) -> None:
        self.s = scheduler

    def step(self):
        out = self.s.schedule()
        for rid in out.new_request_ids:
            self.s.cache.allocate(rid, {"latents": torch.zeros(25)})  # 100 bytes
        finished = {}
        for group in out.groups:
            for rid in group:
                r = self.s.requests[rid]
                if out.mode == "fifo" or r.num_steps_done + 1 >= r.params.num_inference_steps:
                    finished[rid] = f"image-{rid}"
        return out, self.s.update_from_output(out, DiTRunnerOutput(finished=finished))


def test_step_mode_joins_and_leaves_between_steps() -> None:
    s = _scheduler(max_num_seqs=2)
    run = FakeRunner(s)
    s.add_request(_request("a", steps=3))
    s.add_request(_request("b", steps=1))
    s.add_request(_request("c", steps=2))
    out, done = run.step()
    assert out.new_request_ids == ["a", "b"] and out.groups == [["a", "b"]]
    assert [r.request_id for r, _ in done] == ["b"]  # b leaves after its only step
    out, done = run.step()
    assert out.new_request_ids == ["c"] and out.groups == [["a", "c"]]  # c joins mid-flight
    assert done == []
    out, done = run.step()
    assert sorted(r.request_id for r, _ in done) == ["a", "c"]
    assert not s.has_unfinished_requests() and s.cache.num_entries == 0


def test_step_mode_groups_by_image_size() -> None:
    s = _scheduler()
    for rid, size in [
        ("a", 64),
        ("b", 128),
        (
            "c",
            64,
        ),
        ("d", 128),
    ]:
        s.add_request(_request(rid, size=size, cfg=rid == "c"))
    out = s.schedule()
    assert out.groups == [["a", "c"], ["b", "d"]]  # guidance and plain share a call


def test_fifo_mode_batches_identical_pipeline_calls() -> None:
    s = _scheduler(mode="fifo", max_num_seqs=2)
    run = FakeRunner(s)
    s.add_request(_request("a"))
    s.add_request(_request("b", steps=5))
    s.add_request(_request("c"))
    s.add_request(_request("d"))
    out, done = run.step()
    assert out.groups == [["a", "c"]] and len(done) == 2  # b differs, d over the batch limit
    out, done = run.step()
    assert out.groups == [["b"]]
    out, done = run.step()
    assert out.groups == [["d"]]
    assert s.schedule().is_empty


def test_admission_waits_for_cache_memory() -> None:
    s = _scheduler(max_bytes=250)  # room for two 100-byte entries
    run = FakeRunner(s)
    for rid in "abc":
        s.add_request(_request(rid, steps=2))
    out, _ = run.step()
    assert out.new_request_ids == ["a", "b"] and s.num_waiting == 1
    run.step()  # a, b finish and release
    out, _ = run.step()
    assert out.new_request_ids == ["c"]


def test_abort_frees_the_cache_entry() -> None:
    s = _scheduler()
    run = FakeRunner(s)
    s.add_request(_request("a", steps=5))
    s.add_request(_request("b", steps=5))
    run.step()
    assert s.cache.num_entries == 2
    assert s.abort_request("a") and not s.abort_request("a")
    assert s.cache.num_entries == 1 and "a" not in s.cache
    s.add_request(_request("w"))
    assert s.abort_request("w")  # still waiting
    assert s.num_waiting == 0 and s.num_running == 1


def test_cache_manager_expiry_and_errors() -> None:
    cache = DiTCacheManager(DiTCacheConfig(ttl_s=5))
    cache.allocate("a", {"x": torch.zeros(4)})
    assert cache.num_bytes == 16
    with pytest.raises(ValueError, match="request_id: 'a' already has"):
        cache.allocate("a", {})
    now = cache.get("a").touched
    assert cache.clear_expired(now + 1) == []
    assert cache.clear_expired(now + 6) == ["a"] and cache.num_entries == 0
    with pytest.raises(ValueError, match="ttl_s"):
        DiTCacheConfig(ttl_s=0)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"height": 0}, "height"),
        ({"width": 1.5}, "width"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"true_cfg_scale": "4"}, "true_cfg_scale"),
        ({"negative_prompt": 3}, "negative_prompt"),
        ({"seed": -1}, "seed"),
        ({"output_type": "np"}, "output_type"),
    ],
)
def test_params_name_the_bad_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        DiffusionSamplingParams(**kwargs)
    with pytest.raises(ValueError, match="^steps: unknown"):
        DiffusionSamplingParams.from_dict({"steps": 3})
