# SPDX-License-Identifier: Apache-2.0
"""CPP on Ray on CPU: `distributed_executor_backend="ray"` runs vLLM's RayExecutorV2 through
CPURayExecutor, on a local cluster of two fake nodes (tests/conftest.py `ray_cluster`)."""

import os
import time
from pathlib import Path

import pytest

from tests.helpers.greedy_reference import run_engine
from vllm_omni.cpp import cpp_engine_args
from vllm_omni.executor.cpu_ray import RAY_RESOURCE, threads_per_worker


def test_threads_follow_the_node_share():
    assert threads_per_worker({"CPU": 16.0, RAY_RESOURCE: 4.0}) == 4
    assert threads_per_worker({"CPU": 1.0, RAY_RESOURCE: 2.0}) == 1
    assert threads_per_worker({"CPU": 8.0}) == 8


def test_cpu_ray_globals_are_restored():
    from vllm.platforms import current_platform
    from vllm.v1.executor import ray_executor_v2

    from vllm_omni._patches import cpu_ray_globals

    before = current_platform.ray_device_key, ray_executor_v2.RayWorkerProc
    with pytest.raises(RuntimeError), cpu_ray_globals("x", object):
        assert current_platform.ray_device_key == "x"
        assert ray_executor_v2.RayWorkerProc is object
        raise RuntimeError
    assert (current_platform.ray_device_key, ray_executor_v2.RayWorkerProc) == before


def _placement(worker) -> dict:
    import ray

    return {
        "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
        "worker": type(worker.worker).__name__,  # inside vLLM's WorkerWrapperBase
        "pid": os.getpid(),
    }


def _leftovers() -> dict[str, list]:
    """Live actors (vLLM names its workers) and placement groups, from Ray's control store
    (the state API would need the dashboard, which the test cluster does not run)."""
    import ray

    groups = ray.util.placement_group_table().values()
    return {
        "actors": ray.util.list_named_actors(all_namespaces=True),
        "placement_groups": [g["placement_group_id"] for g in groups if g["state"] != "REMOVED"],
    }


def _gone(pids: list[int], timeout_s: float = 20.0) -> bool:
    import psutil

    deadline = time.monotonic() + timeout_s
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not any(psutil.pid_exists(p) for p in pids)


@pytest.mark.engine
def test_cpp_pp2_on_ray_matches_plain_pp1(
    tiny_models, ray_cluster, greedy_prompts, greedy_reference, monkeypatch
):
    import ray

    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(_placement)
    sets = {"long": greedy_prompts["long"][:1], "prefix": greedy_prompts["prefix"]}
    args = cpp_engine_args(pipeline_parallel_size=2, distributed_executor_backend="ray")
    status = Path(args["additional_config"]["cpp"]["status_path"])

    def inspect(llm) -> dict:
        # The CPP scheduler publishes its cost-model status there while it runs.
        return {"workers": llm.collective_rpc(_placement), "cpp_scheduler": status.exists()}

    on_ray = run_engine(tiny_models["llama-8l"], sets, inspect, max_model_len=4096, **args)
    # Shut down: no actor, placement group or worker process left, both slots free again.
    assert _leftovers() == {"actors": [], "placement_groups": []}
    assert ray.available_resources().get(RAY_RESOURCE) == 2
    assert _gone([w["pid"] for w in on_ray["workers"]])

    # Plain PP=1's tokens, which CPP at PP=2 under multiprocessing also gives for these prompts
    # (tests/cpp/test_cpp_engine.py).
    assert on_ray["long"] == greedy_reference["long"][:1]
    assert on_ray["prefix"] == greedy_reference["prefix"]
    nodes = [w["node"] for w in on_ray["workers"]]
    assert None not in nodes and len(set(nodes)) == 2, nodes  # one rank per fake node
    assert {w["worker"] for w in on_ray["workers"]} == {"OmniCPUWorker"}
    assert on_ray["cpp_scheduler"]
    # Both stages ran the same CPP steps, and the 3500-token prompts took more than one each.
    chunks = [[r["chunks"] for r in rank] for rank in on_ray["step_records"]]
    assert chunks[0] == chunks[1]
    assert max(x for step in chunks[0] for x, _ in step) < 3000
