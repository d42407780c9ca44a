# SPDX-License-Identifier: Apache-2.0
"""AR stages on Ray (`backend: ray`): each stage's whole vLLM engine in a Ray actor, on the local
two-node cluster of tests/conftest.py. The tiny Qwen2.5-Omni with its thinker on one node, its
talker on the other and code2wav in an actor too: transformers' tokens, codes and waveform (as
the local run gives), streamed pieces through the actors, an aborted request released in the
engine, a killed actor failing its request fast, and nothing left behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
import pytest
import torch

from vllm_omni import OmniLLM
from vllm_omni.config.stage_config import StageConfig
from vllm_omni.engine import process_host
from vllm_omni.engine.ray_ar_stage import ARStageError, RayARStage
from vllm_omni.engine.request_run import StageDelta

from ..models.qwen2_5_omni.test_omni_llm import (
    PROMPT,
    SAMPLES_PER_CODE,
    SEED,
    WAVE_TOLERANCE,
    hf,  # noqa: F401 (a fixture)
    hf_reference,
    hf_waveform,
    stage_params,
)


def test_an_actor_no_node_can_place_fails_naming_its_resources(ray_cluster, monkeypatch):
    monkeypatch.setattr(process_host, "PLACEMENT_TIMEOUT_S", 3.0)
    stage = RayARStage(
        StageConfig(
            name="lm", engine_type="AR", model="/m", backend="ray", resources={"no_such": 1}
        )
    )
    with pytest.raises(RuntimeError, match=r"resources: no Ray node placed stage 'lm'.*no_such"):
        stage.start()
    assert not stage.is_alive


@pytest.mark.engine  # the actor builds vLLM's engine config
def test_a_bad_engine_argument_fails_the_start_naming_it(tiny_models, ray_cluster):
    stage = RayARStage(
        StageConfig(
            name="lm",
            engine_type="AR",
            model=str(tiny_models["qwen2-2l"]),
            backend="ray",
            engine_args={"max_model_len": 10**9},
        )
    )
    with pytest.raises(ValueError, match="max_model_len"):  # vLLM's error, from the actor
        stage.start()
    assert not stage.is_alive and _stage_actors() == []


def _stage_actors() -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]


def _engine_processes(stage: RayARStage) -> list[psutil.Process]:
    return psutil.Process(stage.placement["pid"]).children(recursive=True)


def _shared_memory_of(processes: list[psutil.Process]) -> set[Path]:
    """The shared memory (Python's and multiprocessing's) these processes have mapped."""
    paths = {Path(m.path) for p in processes for m in p.memory_maps(grouped=True)}
    return {
        path
        for path in paths
        if path.parent == Path("/dev/shm") and path.name.startswith(("psm_", "sem.mp-"))
    }


def _gone(processes: list[psutil.Process], timeout_s: float = 20.0) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    return not alive


@pytest.fixture(scope="module")
def omni(tiny_models, ray_cluster):
    def on_node(i: int) -> dict:  # pinned by the cluster's per-node test resource
        return {
            "backend": "ray",
            "resources": {"CPU": 0, f"test_node_{i}": 1},
            "engine_args": {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True},
        }

    overrides = {"thinker": on_node(0), "talker": on_node(1), "code2wav": {"backend": "ray"}}
    llm = OmniLLM(tiny_models["qwen2.5-omni"], stage_overrides=overrides)
    yield llm
    llm.shutdown()


@pytest.mark.engine
def test_engines_run_in_actors_on_their_nodes(omni):
    import os

    thinker, talker = omni.engine.stages["thinker"], omni.engine.stages["talker"]
    assert thinker.placement["node_id"] != talker.placement["node_id"]
    for stage in (thinker, talker):
        assert stage.is_alive and stage.placement["pid"] != os.getpid()
        assert _engine_processes(stage)  # the engine core (and worker) under the actor
    # Not under this process (the fake nodes' Ray processes are, further down).
    assert not any("EngineCore" in p.name() for p in psutil.Process().children())
    actors = _stage_actors()
    for name in ("thinker", "talker", "code2wav"):
        assert any(a.startswith(f"vllm_omni-stage-{name}-") for a in actors), actors


@pytest.mark.engine
def test_text_codes_and_waveform_match_transformers(omni, hf):  # noqa: F811
    out = omni.generate({"prompt": PROMPT, "voice": "Chelsie"}, stage_params(), use_tqdm=False)[0]
    text_ids, codes = hf_reference(hf, PROMPT, "Chelsie")
    assert out.token_ids == text_ids
    assert len(codes) > 0 and out.codec_token_ids == codes
    assert out.audio.shape == (len(codes) * SAMPLES_PER_CODE,)
    reference = hf_waveform(hf, codes, "Chelsie", SEED)
    assert (out.audio - reference).abs().max().item() <= WAVE_TOLERANCE * reference.abs().max()
    stats = omni.get_stage_stats()
    assert stats["thinker"]["num_finished"] >= 1 and stats["talker"]["num_finished"] >= 1


@pytest.mark.engine
def test_the_engines_own_errors_come_back_as_they_are(omni):
    from vllm.exceptions import VLLMValidationError

    long_prompt = "<|im_start|>user\n" + "hello " * 3000 + "<|im_end|>\n"
    with pytest.raises(VLLMValidationError, match="maximum context length") as error:
        omni.generate({"prompt": long_prompt}, stage_params(), use_tqdm=False)
    assert "Traceback" not in str(error.value) and "ray::" not in str(error.value)
    assert not omni.engine.dead_stages()


def _long_params(talker_tokens: int) -> dict:
    from vllm import SamplingParams

    params = stage_params()
    params["thinker"] = SamplingParams(temperature=0, max_tokens=64)
    # No end code (the start code, 61, is never sampled): exactly `talker_tokens` codes.
    params["talker"] = SamplingParams(
        temperature=0, max_tokens=talker_tokens, repetition_penalty=1.05, stop_token_ids=[61]
    )
    return params


def _start(omni, request_id: str, params: dict, events: list):
    inputs, prepared = omni.engine.prepare({"prompt": PROMPT, "stream": True}, params)
    return asyncio.ensure_future(
        omni.engine.run_prepared(inputs, prepared, request_id, on_event=events.append)
    )


async def _until_talker_speaks(events: list, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(isinstance(e, StageDelta) and e.stage == "talker" for e in events):
        assert time.monotonic() < deadline, "the talker never spoke"
        await asyncio.sleep(0.05)


@pytest.mark.engine
def test_streamed_pieces_come_through_the_actors(omni):
    params = _long_params(160)
    whole = omni.generate({"prompt": PROMPT}, params, use_tqdm=False)[0]
    events: list = []

    async def streamed():
        return await _start(omni, "streamed", params, events)

    out = omni._call(streamed())
    assert out.token_ids == whole.token_ids and out.codec_token_ids == whole.codec_token_ids
    deltas = [e for e in events if isinstance(e, StageDelta)]
    text = "".join(e.data["text"] for e in deltas if e.stage == "thinker" and "text" in e.data)
    assert text == out.text
    codes = [e.data["codec_tokens"] for e in deltas if e.stage == "talker"]
    assert len(codes) >= 2 and torch.cat(codes).tolist() == out.codec_token_ids
    audio = [e.data["audio"] for e in deltas if e.stage == "code2wav"]
    assert len(audio) >= 2 and torch.equal(torch.cat(audio), out.audio)


def _held(stats: dict) -> tuple[int, int]:
    """Requests an AR stage's actor runs, and those its engine holds."""
    return stats["num_in_actor"], stats["num_unfinished"]


@pytest.mark.engine
def test_an_aborted_request_leaves_the_engines(omni):
    events: list = []

    async def aborted():
        task = _start(omni, "aborted", _long_params(2000), events)
        await _until_talker_speaks(events)
        assert omni.engine.abort("aborted")
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # the abort reaches the actor, then its engine
            stats = await omni.engine.stats()
            if not any(_held(stats[s]) for s in ("thinker", "talker")):
                break
            await asyncio.sleep(0.1)
        return stats

    stats = omni._call(aborted())
    assert _held(stats["thinker"]) == _held(stats["talker"]) == (0, 0)
    assert omni.generate({"prompt": PROMPT}, stage_params(), use_tqdm=False)[0].audio is not None


@pytest.mark.engine
def test_a_killed_actor_fails_its_request_fast_and_nothing_stays(omni):
    import ray

    talker = omni.engine.stages["talker"]
    engine_processes = _engine_processes(talker)
    shared_memory = _shared_memory_of(engine_processes)
    events: list = []

    async def doomed():
        task = _start(omni, "doomed", _long_params(2000), events)
        await _until_talker_speaks(events)
        ray.kill(talker.actor)
        return await asyncio.wait_for(task, 30)

    with pytest.raises(ARStageError, match=r"AR stage 'talker': Ray actor died"):
        omni._call(doomed())
    assert omni.engine.dead_stages() == ["talker"]
    assert _gone(engine_processes)  # the engine core went with its actor
    # What the killed engine would have unlinked (vLLM's queues to its worker, ~400 MiB here,
    # docs/distributed.md): gone here, so that test runs do not fill /dev/shm.
    for path in shared_memory:
        path.unlink(missing_ok=True)

    processes = [p for s in ("thinker",) for p in _engine_processes(omni.engine.stages[s])]
    omni.shutdown()
    assert _gone(processes)
    assert _stage_actors() == []
