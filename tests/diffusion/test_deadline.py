# SPDX-License-Identifier: Apache-2.0
"""Deadline-aware DiT step scheduling without a model: urgency order, one shape per step unless
every request in time can spare more, preemption without recompute, the starvation guard,
admission control, SLO accounting."""

from __future__ import annotations

import time

import pytest
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.deadline import DeadlineUnreachable, StepCostModel
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiffusionScheduler, DiTRunnerOutput, DiTSchedulerConfig

ROW_STEP_S = {(64, 64): 0.01, (256, 256): 0.16}  # what FakeRunner reports per row-step


def _request(rid: str, size: int = 64, steps: int = 10, slo_s: float | None = None):
    deadline = None if slo_s is None else time.time() + slo_s
    params = DiffusionSamplingParams(
        height=size, width=size, num_inference_steps=steps, seed=0, deadline=deadline
    )
    return DiTRequest(rid, params, {"prompt_embeds": torch.zeros(3, 4)})


def _scheduler(max_num_seqs=4, admission_control=False, starvation_steps=64):
    config = DiTSchedulerConfig(
        "step",
        max_num_seqs,
        policy="deadline",
        admission_control=admission_control,
        starvation_steps=starvation_steps,
    )
    s = DiffusionScheduler(config, DiTCacheManager(), lambda r: 100)
    for shape, seconds in ROW_STEP_S.items():  # as if measured already
        s.costs.observe(shape, 1, seconds)
    return s


class FakeRunner:
    def __init__(self, scheduler: DiffusionScheduler) -> None:
        self.s = scheduler
        self.prepared: list[str] = []

    def step(self):
        out = self.s.schedule()
        for rid in out.new_request_ids:
            self.prepared.append(rid)
            self.s.cache.allocate(rid, {"latents": torch.zeros(25)})
        finished, seconds = {}, []
        for group in out.groups:
            for rid in group:
                r = self.s.requests[rid]
                if r.num_steps_done + 1 >= r.num_steps:
                    finished[rid] = rid
            seconds.append(ROW_STEP_S[self.s.requests[group[0]].shape_key] * len(group))
        done = self.s.update_from_output(out, DiTRunnerOutput(finished, seconds))
        return out, [r.request_id for r, _ in done]


def test_least_slack_first_one_shape_per_step_and_preemption_keeps_state() -> None:
    s = _scheduler(max_num_seqs=2)
    run = FakeRunner(s)
    s.add_request(_request("big", size=256, steps=10, slo_s=60))  # plenty of slack
    out, _ = run.step()
    assert out.groups == [["big"]]
    # urgent small requests arrive: they take the next steps, the big one waits
    for rid in ("s1", "s2", "s3"):
        s.add_request(_request(rid, steps=3, slo_s=0.5))
    out, _ = run.step()
    assert len(out.groups) == 1 and set(out.groups[0]) == {"s1", "s2"}
    assert "big" in s.cache  # preempted at a step boundary: its state stays
    finished = []
    while s.has_unfinished_requests():
        _, done = run.step()
        finished += done
    assert finished[:3] == ["s1", "s2", "s3"] and finished[-1] == "big"
    assert run.prepared.count("big") == 1  # resumed, never recomputed
    assert s.requests == {} and s.cache.num_entries == 0
    assert s.slo.met == 4 and s.slo.missed == 0


def test_other_shapes_ride_along_when_every_on_time_request_can_spare_it() -> None:
    s = _scheduler(max_num_seqs=4)
    # Nobody in a hurry (and a late request is past saving): both shapes advance, as in fcfs.
    s.add_request(_request("small", steps=5, slo_s=10))
    s.add_request(_request("late", steps=5, slo_s=0.01))
    s.add_request(_request("big", size=256, steps=5))
    time.sleep(0.02)
    out = s.schedule()
    assert sorted(map(sorted, out.groups)) == [["big"], ["late", "small"]]
    # A small request due in 0.48 s, with 0.08 s of work due by then (its own and the late
    # one's), has about 0.13 s to spare per remaining step: not the big one's 0.16 s.
    s.add_request(_request("tight", steps=3, slo_s=0.03 + 3 * 0.15))
    out = s.schedule()
    assert "tight" in out.groups[0] and all("big" not in group for group in out.groups)


def test_late_requests_run_in_the_slack_on_time_requests_can_spare() -> None:
    s = _scheduler(max_num_seqs=1)
    s.add_request(_request("late", steps=20, slo_s=0.1))  # needs 0.2 s
    s.add_request(_request("later", steps=5, slo_s=0.01))  # late too, needs 0.05 s
    s.add_request(_request("tight", steps=10, slo_s=0.25))  # 0.15 s of slack
    s.add_request(_request("relaxed", size=256, steps=2, slo_s=5))  # seconds of slack
    s.add_request(_request("no_slo", steps=10))
    now = time.time()
    order = s.deadline_policy.order(list(s.waiting), now, s.engine_step)
    # Late requests, least work first, each counted with the late work before it: "later"
    # (0.05 s) fits in tight's slack, "late" (0.05 + 0.2 s) does not, but fits in relaxed's.
    assert [r.request_id for r in order] == ["later", "tight", "late", "relaxed", "no_slo"]


def test_starvation_guard_lets_a_best_effort_request_through() -> None:
    s = _scheduler(max_num_seqs=1, starvation_steps=5)
    run = FakeRunner(s)
    s.add_request(_request("best_effort", size=256, steps=2))
    advanced_at = []
    for i in range(30):  # a steady stream of urgent small requests
        s.add_request(_request(f"u{i}", steps=1, slo_s=0.5))
        out, _ = run.step()
        if out.groups[0] == ["best_effort"]:
            advanced_at.append(i)
    assert len(advanced_at) == 2 and advanced_at[0] <= 6 and advanced_at[1] - advanced_at[0] <= 7


def test_admission_control_refuses_what_cannot_finish_in_time() -> None:
    s = _scheduler(admission_control=True)
    s.add_request(_request("a", size=256, steps=10, slo_s=2.0))  # 1.6 s of work: fits
    with pytest.raises(DeadlineUnreachable, match="latency_slo_ms"):
        s.add_request(_request("b", size=256, steps=10, slo_s=2.0))  # behind a: 3.2 s
    s.add_request(_request("c", steps=10, slo_s=1.0))  # earlier deadline, 0.1 s: fits
    s.add_request(_request("d", size=256, steps=10))  # no SLO: always admitted
    assert s.slo.rejected == 1 and set(s.requests) == {"a", "c", "d"}


def test_cost_model_prices_unmeasured_shapes_by_pixels() -> None:
    costs = StepCostModel()
    assert costs.row_step((64, 64)) == 0.0
    costs.observe((64, 64), rows=4, seconds=0.04)
    assert costs.row_step((64, 64)) == pytest.approx(0.01)
    assert costs.row_step((128, 128)) == pytest.approx(0.04)
    costs.observe((64, 64), rows=1, seconds=0.02)  # moving average, not the last value
    assert 0.01 < costs.row_step((64, 64)) < 0.02


def test_policy_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="scheduling_policy"):
        DiTSchedulerConfig("fifo", policy="deadline")
    with pytest.raises(ValueError, match="admission_control"):
        DiTSchedulerConfig("step", admission_control=True)
    with pytest.raises(ValueError, match="latency_slo_ms"):
        DiffusionSamplingParams(latency_slo_ms=0)


def test_preempted_requests_make_the_same_images(tiny_models) -> None:
    """The DiT stage in-process on the tiny pipeline: under the deadline policy an urgent
    small request overtakes a running large one, which resumes from its kept state and
    still makes diffusers' image."""
    from vllm_omni.diffusion.config import DiTConfig
    from vllm_omni.diffusion.engine_core import DiffusionEngineCore

    from ..helpers.diffusers_reference import load_pipeline, max_pixel_diff, reference_image

    pipe = load_pipeline(tiny_models["qwen-image"])
    with torch.inference_mode():
        embeds = {p: pipe.encode_prompt(p, device=torch.device("cpu"))[0][0] for p in ("a", "b")}
    config = DiTConfig(model=str(tiny_models["qwen-image"]), scheduling_policy="deadline")
    core = DiffusionEngineCore(config, "step", "qwen_image", pipe=pipe)
    large = DiffusionSamplingParams(height=96, width=96, num_inference_steps=6, seed=1)
    small = DiffusionSamplingParams(
        height=32, width=32, num_inference_steps=3, seed=2, deadline=time.time() + 60
    )
    core.add_request("large", {"prompt_embeds": embeds["a"]}, large)
    order, results = [], {}
    for step in range(20):
        if step == 2:
            core.add_request("small", {"prompt_embeds": embeds["b"]}, small)
        scheduled_before = dict(core.scheduler.requests)
        finished, _, _ = core.step()
        order += [rid for rid in scheduled_before if rid not in core.scheduler.requests]
        results.update({r.request_id: out for r, out in finished})
        if not core.has_unfinished_requests():
            break
    assert order == ["small", "large"]  # the small one overtook
    assert max_pixel_diff(results["large"], reference_image(pipe, "a", large)) <= 2
    assert max_pixel_diff(results["small"], reference_image(pipe, "b", small)) <= 2
    assert core.stats()["slo_met"] == 1 and core.cache.num_entries == 0


def test_refusal_crosses_the_process_boundary_as_its_own_error() -> None:
    """Admission control's refusal leaves the DiT process as DeadlineUnreachable (the server
    answers 429), not as a ValueError (400) or a stage failure (500)."""
    import asyncio
    import pickle
    import queue

    from vllm_omni.config.stage_config import StageConfig
    from vllm_omni.diffusion.engine_core import _handle
    from vllm_omni.engine.process_stage import ProcessStage

    class RefusingCore:
        def add_request(self, *args):
            raise DeadlineUnreachable("latency_slo_ms: cannot be met")

    outbox = queue.Queue()
    params = DiffusionSamplingParams()
    assert _handle(RefusingCore(), ("add", "r1", ({}, params)), outbox)
    message = outbox.get_nowait()
    kind, key, error = pickle.loads(pickle.dumps(message))  # as it crosses the boundary
    assert (kind, key, type(error), str(error)) == (
        "failed",
        "r1",
        DeadlineUnreachable,
        "latency_slo_ms: cannot be met",
    )

    stage = ProcessStage(
        StageConfig(name="dit", engine_type="DiT", model="unused", executor="qwen_image")
    )
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        stage._pending["r1"] = future
        stage._dispatch(message)
        with pytest.raises(DeadlineUnreachable, match="latency_slo_ms"):
            future.result()
    finally:
        loop.close()


def test_decodes_are_priced_apart_from_steps() -> None:
    # A step that ends requests also decodes them: its denoising seconds price the row-step,
    # the decode's price the shape's decode, which every request still has ahead of it.
    s = _scheduler(max_num_seqs=2)
    s.add_request(_request("a", size=256, steps=1, slo_s=60))
    s.add_request(_request("b", size=256, steps=3, slo_s=60))
    out = s.schedule()
    for rid in out.new_request_ids:
        s.cache.allocate(rid, {"latents": torch.zeros(25)})
    assert sorted(out.groups[0]) == ["a", "b"]
    s.update_from_output(out, DiTRunnerOutput({"a": "image"}, [2 * 0.16], [0.5]))
    assert s.costs.row_step((256, 256)) == pytest.approx(0.16)  # the decode is not a step
    assert s.costs.decode_s((256, 256)) == pytest.approx(0.5)
    b = s.requests["b"]
    assert s.costs.remaining_s(b) == pytest.approx(2 * 0.16 + 0.5)
    assert s.costs.step_s(b) == pytest.approx(0.16)  # not its last step yet
    b.num_steps_done = 2
    assert s.costs.step_s(b) == pytest.approx(0.16 + 0.5)
    # a size never decoded is priced by its pixels, like its steps
    assert s.costs.decode_s((64, 64)) == pytest.approx(0.5 / 16)


def test_a_field_error_crosses_the_process_boundary_with_its_field() -> None:
    """A request the stage process refuses (a FieldError) reaches the orchestrator as one, so
    the server's 400 names the field."""
    import asyncio
    import pickle
    import queue

    from vllm_omni.config.stage_config import StageConfig
    from vllm_omni.diffusion.engine_core import _handle
    from vllm_omni.engine.process_stage import ProcessStage
    from vllm_omni.errors import FieldError

    class RefusingCore:
        def add_request(self, *args):
            raise FieldError("cache_threshold", "not supported")

    outbox = queue.Queue()
    assert _handle(RefusingCore(), ("add", "r1", ({}, DiffusionSamplingParams())), outbox)
    message = pickle.loads(pickle.dumps(outbox.get_nowait()))
    stage = ProcessStage(
        StageConfig(name="dit", engine_type="DiT", model="unused", executor="qwen_image")
    )
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        stage._pending["r1"] = future
        stage._dispatch(message)
        with pytest.raises(FieldError, match="cache_threshold: not supported") as refused:
            future.result()
        assert refused.value.field == "cache_threshold"
    finally:
        loop.close()
