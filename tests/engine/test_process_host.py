# SPDX-License-Identifier: Apache-2.0
"""Omni stages on Ray (`backend: ray`), on the local two-node cluster of tests/conftest.py:
the DiT stage's loop and the text encoder's whole vLLM engine each in a Ray actor.
Same images as diffusers' pipeline (as the local run gives), a killed actor fails its requests
fast and shows as a dead stage, and nothing stays behind."""

from __future__ import annotations

import asyncio
import os

import pytest

from vllm_omni import DiffusionSamplingParams, OmniLLM
from vllm_omni.config.stage_config import StageConfig

from ..helpers.diffusers_reference import load_pipeline, max_pixel_diff, reference_image

CASES = [
    (
        "a red cat on a blue sofa",
        DiffusionSamplingParams(height=64, width=64, num_inference_steps=3, seed=7),
    ),
    ("two apples", DiffusionSamplingParams(height=64, width=96, num_inference_steps=2, seed=9)),
]


def test_backend_and_resources_are_validated():
    base = dict(name="dit", engine_type="DiT", model="/m", executor="qwen_image")
    with pytest.raises(ValueError, match="backend: must be one of"):
        StageConfig(**base, backend="k8s")
    with pytest.raises(ValueError, match="resources.GPU: must be a number >= 0"):
        StageConfig(**base, backend="ray", resources={"GPU": -1})
    # An AR stage's engine runs in its actor; its workers are the actor's processes (mp) or
    # Ray actors of their own (vLLM's Ray executor).
    for executor in ("mp", "ray"):
        StageConfig(name="lm", engine_type="AR", model="/m", executor=executor, backend="ray")
    assert StageConfig(**base, backend="ray", resources={"GPU": 1}).resources == {"GPU": 1}


def _stage_actors() -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]


@pytest.mark.engine
def test_stages_on_ray_match_diffusers_and_fail_fast(tiny_models, ray_cluster):
    import ray

    from vllm_omni.engine.process_stage import ProcessStageError

    model = tiny_models["qwen-image"]
    omni = OmniLLM(
        model,
        stage_overrides={
            "text_encoder": {"backend": "ray", "engine_args": {"enforce_eager": True}},
            "dit": {"backend": "ray"},
        },
    )
    try:
        dit = omni.engine.stages["dit"]
        assert dit.pid is None and dit.is_alive  # not a local process
        encoder = omni.engine.stages["text_encoder"]
        assert encoder.is_alive and encoder.placement["pid"] != os.getpid()
        actors = _stage_actors()
        for stage in ("dit", "text_encoder"):
            assert any(name.startswith(f"vllm_omni-stage-{stage}-") for name in actors), actors

        pipe = load_pipeline(model)
        outputs = omni.generate([p for p, _ in CASES], [s for _, s in CASES], use_tqdm=False)
        for (prompt, params), out in zip(CASES, outputs):
            diff = max_pixel_diff(out.images[0], reference_image(pipe, prompt, params))
            assert diff <= 2, f"{prompt!r}: max pixel difference {diff} > 2/255"

        # A dead actor fails the requests it held, fast, and its stage shows as dead.
        slow = DiffusionSamplingParams(height=64, width=64, num_inference_steps=1000, seed=1)

        async def doomed():
            task = asyncio.ensure_future(omni.engine.generate("doomed", slow, "doomed"))
            await asyncio.sleep(3.0)
            ray.kill(dit._process.actor)
            return await asyncio.wait_for(task, 30)

        with pytest.raises(ProcessStageError, match="Ray actor died"):
            omni._call(doomed())
        assert omni.engine.dead_stages() == ["dit"]
    finally:
        omni.shutdown()
    groups = ray.util.placement_group_table().values()
    assert [g for g in groups if g["state"] != "REMOVED"] == []
    assert _stage_actors() == []
