# SPDX-License-Identifier: Apache-2.0
from types import SimpleNamespace

import pytest

from vllm_omni.platform import cpu_defaults
from vllm_omni.platform.cpu_defaults import GiB, plan_kv_cache_bytes, plan_thread_binding


def test_thread_binding_left_to_vllm_when_numa_nodes_suffice():
    assert plan_thread_binding([0, 1], num_numa_nodes=1, local_world_size=1) is None
    assert plan_thread_binding(list(range(8)), num_numa_nodes=2, local_world_size=2) is None


@pytest.mark.parametrize(
    "cpus, world, expected",
    [
        ([0, 1], 2, "0|1"),
        ([3, 0, 2, 1], 2, "0,1|2,3"),
        (list(range(8)), 4, "0,1|2,3|4,5|6,7"),
        ([0, 1, 2], 2, "0|1"),
        ([0], 2, "nobind"),
    ],
)
def test_thread_binding_splits_cores_evenly(cpus, world, expected):
    assert plan_thread_binding(cpus, num_numa_nodes=1, local_world_size=world) == expected


def test_kv_cache_left_to_vllm_when_it_fits():
    assert plan_kv_cache_bytes(100 * GiB, 128 * GiB, utilization=0.3, local_world_size=2) is None


def test_kv_cache_sized_when_default_overcommits():
    # 2 workers x 0.92 x 24 GiB cannot fit in 20 GiB: each gets 0.3 * 20 / 2 = 3 GiB.
    assert plan_kv_cache_bytes(20 * GiB, 24 * GiB, 0.92, 2) == 3 * GiB
    assert plan_kv_cache_bytes(2 * GiB, 24 * GiB, 0.92, 2) == cpu_defaults.MIN_KV_CACHE_BYTES
    assert plan_kv_cache_bytes(500 * GiB, 512 * GiB, 0.92, 1) == cpu_defaults.MAX_KV_CACHE_BYTES


def _config(world_size, kv_bytes=None, utilization=0.92, backend="mp"):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            local_world_size=world_size, distributed_executor_backend=backend
        ),
        cache_config=SimpleNamespace(
            kv_cache_memory_bytes=kv_bytes, gpu_memory_utilization=utilization
        ),
    )


@pytest.fixture
def small_machine(monkeypatch):
    from vllm.utils import cpu_resource_utils

    for var in (
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_SIM_MULTI_NUMA",
        cpu_defaults.WRITTEN_BIND_ENV,
        *cpu_defaults.MALLOC_DEFAULTS,
    ):
        monkeypatch.setenv(var, "")  # so that monkeypatch restores the real state afterwards
        monkeypatch.delenv(var)
    monkeypatch.setattr(cpu_defaults.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cpu_resource_utils, "get_visible_memory_node", lambda: [0])
    monkeypatch.setattr(
        cpu_resource_utils,
        "get_memory_node_info",
        lambda node: SimpleNamespace(total_memory=24 * GiB, available_memory=20 * GiB),
    )


def test_apply_fills_binding_and_kv_cache_on_a_small_machine(small_machine, monkeypatch):
    config = _config(world_size=2)
    cpu_defaults.apply_cpu_defaults(config)
    assert cpu_defaults.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert config.cache_config.kv_cache_memory_bytes == 3 * GiB
    assert cpu_defaults.os.environ["MALLOC_TRIM_THRESHOLD_"] == str(1 << 30)


def test_malloc_defaults_leave_user_and_preloaded_allocators_alone():
    assert cpu_defaults.malloc_env_defaults({}) == cpu_defaults.MALLOC_DEFAULTS
    assert cpu_defaults.malloc_env_defaults({"MALLOC_TOP_PAD_": "0"}) == {}
    assert cpu_defaults.malloc_env_defaults({"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}) == {}


def test_apply_keeps_explicit_user_settings(small_machine, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1|0")
    config = _config(world_size=2, kv_bytes=5 * GiB)
    cpu_defaults.apply_cpu_defaults(config)
    assert cpu_defaults.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1|0"
    assert config.cache_config.kv_cache_memory_bytes == 5 * GiB

    fitting = _config(world_size=2, utilization=0.2)
    cpu_defaults.apply_cpu_defaults(fitting)
    assert fitting.cache_config.kv_cache_memory_bytes is None


def test_own_binding_is_replaced_for_a_later_engine(small_machine):
    cpu_defaults.apply_cpu_defaults(_config(world_size=2))
    assert cpu_defaults.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    # A PP=1 engine afterwards in the same process gets vLLM's own default back.
    cpu_defaults.apply_cpu_defaults(_config(world_size=1))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cpu_defaults.os.environ


def test_inherited_own_binding_is_replaced_in_a_child_process(small_machine):
    import subprocess
    import sys

    cpu_defaults.apply_cpu_defaults(_config(world_size=2))
    # A process started now (a `vllm serve -pp 4` from a script that ran a PP=2 engine) inherits
    # the binding and must plan its own for four ranks on its (real) machine.
    child = (
        "import os; from types import SimpleNamespace as N;"
        "from vllm.utils.cpu_resource_utils import get_visible_memory_node;"
        "from vllm_omni.platform import cpu_defaults as c;"
        "c.apply_cpu_defaults(N(parallel_config=N(local_world_size=4,"
        " distributed_executor_backend='mp'), cache_config=N(kv_cache_memory_bytes=1)));"
        "plan = c.plan_thread_binding(sorted(os.sched_getaffinity(0)),"
        " len(get_visible_memory_node()), 4);"
        "print(os.environ.get(c.BIND_ENV, '-'), plan or '-')"
    )
    env = {**cpu_defaults.os.environ, "VLLM_PLUGINS": ""}
    out = subprocess.run(
        [sys.executable, "-c", child], env=env, capture_output=True, text=True, check=True
    )
    got, planned = out.stdout.split()[-2:]
    assert got == planned != "0|1"
    # A value the user sets afterwards is theirs, even in the same process.
    cpu_defaults.os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "1|0"
    cpu_defaults.apply_cpu_defaults(_config(world_size=2))
    assert cpu_defaults.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1|0"


def test_ray_on_cpu_runs_through_the_cpu_ray_executor(small_machine):
    from vllm_omni.executor.cpu_ray import CPURayExecutor

    config = _config(world_size=2, backend="ray")
    cpu_defaults.apply_cpu_defaults(config)
    assert config.parallel_config.distributed_executor_backend is CPURayExecutor
    local = _config(world_size=2)
    cpu_defaults.apply_cpu_defaults(local)
    assert local.parallel_config.distributed_executor_backend == "mp"
