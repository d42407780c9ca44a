# SPDX-License-Identifier: Apache-2.0
"""Shared pytest fixtures, and a guard that lets pytest's exit code reach CI."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from vllm_omni.testing.tiny import TinyModels, default_models_dir

_SESSION = pytest.StashKey[pytest.Session]()


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    """The tiny models (name -> folder), each built into the shared cache when a test first asks
    for it and reused after."""
    return TinyModels(default_models_dir())


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory) -> Path:
    """A Hugging Face hub cache of this session holding the tiny models under the real repo
    names (vllm_omni/testing/tiny_hub.py). Use it through `hub_env` or `offline_hub`."""
    from vllm_omni.testing.tiny_hub import build_hub_cache

    cache = tmp_path_factory.mktemp("hf-hub")
    build_hub_cache(cache)
    return cache


@pytest.fixture(scope="session")
def hub_env(hub_cache) -> dict[str, str]:
    """The environment of a process that finds models in `hub_cache`, offline."""
    return {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def offline_hub(hub_cache) -> Iterator[Path]:
    from tests.helpers.hub import offline_hub_at

    with offline_hub_at(hub_cache):
        yield hub_cache


@pytest.fixture(scope="session")
def greedy_prompts() -> dict[str, list[list[int]]]:
    from tests.helpers.greedy_reference import make_prompts

    return make_prompts()


@pytest.fixture(scope="session")
def greedy_reference(tiny_models, greedy_prompts) -> dict:
    """Plain vLLM PP=1's greedy tokens on llama-8l for `greedy_prompts` and, under "text" and
    "chat_prompt", for the text prompts (tests/helpers/greedy_reference.py): one engine for both."""
    from tests.helpers.greedy_reference import REFERENCE_MAX_MODEL_LEN, run_engine, text_greedy

    return run_engine(
        tiny_models["llama-8l"],
        greedy_prompts,
        text_greedy,
        max_model_len=REFERENCE_MAX_MODEL_LEN,
    )


@pytest.fixture(autouse=True, scope="session")
def _fresh_cpp_cache(tmp_path_factory) -> Iterator[None]:
    """CPP engines fit and cache their cost model as they run: in the tests, into a folder of
    this session (set before any engine starts), not the developer's cache."""
    from vllm_omni.platform.cache_dir import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("vllm_omni-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


KV_CACHE_GIB = "1"
"""Every engine's KV cache in the tests (vLLM's `VLLM_CPU_KVCACHE_SPACE`, in GiB), unless the
environment sets one. The plugin's CPU default is up to 4 GiB per worker (3 GiB for one worker
here), and vLLM zeroes the whole cache at start-up, 1-3 s per GiB on this 2-core VM: the
Qwen2.5-Omni graph (thinker and talker) started in 51 s instead of 63 s, and with the hand-off
server's test, two paired runs took 129 and 130 s instead of 149 and 132 s. 1 GiB holds 131K
tokens of the tiny Llama, twice the longest context a test uses; the defaults themselves are
unit-tested (tests/platform/test_cpu_defaults.py) and `make demo` runs with them."""


@pytest.fixture(autouse=True, scope="session")
def _small_kv_caches() -> Iterator[None]:
    # Set before any engine starts: servers and Ray nodes started by the tests inherit it.
    # It wins over `kv_cache_memory_bytes` (vLLM's rule), so a test that sizes its cache
    # itself unsets it (tests/cpp/test_cpp_engine.py's preemption test).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(
            "VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        )
        yield


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster of two fake nodes on loopback, each with one CPU and one `vllm_cpu`
    worker slot, shared by every test that needs Ray; yields its address, exported as
    RAY_ADDRESS so that engine-core processes join it rather than start a Ray of their own."""
    import ray
    from ray.cluster_utils import Cluster

    from vllm_omni.executor.cpu_ray import RAY_RESOURCE

    before = os.environ.get("RAY_ADDRESS")
    cluster = Cluster()
    try:
        for i in range(2):  # `test_node_<i>`: a resource that pins an actor to node i
            resources = {RAY_RESOURCE: 1, f"test_node_{i}": 1}
            cluster.add_node(num_cpus=1, resources=resources, include_dashboard=False)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        os.environ["RAY_ADDRESS"] = cluster.address
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()
        if before is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = before


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return f"pid {proc.pid}: (gone)"


def _is_resource_tracker(proc: psutil.Process) -> bool:
    # multiprocessing's own helper: it ends by itself once this process exits, and ending it
    # first would leave shared memory behind.
    try:
        return "multiprocessing.resource_tracker" in " ".join(proc.cmdline())
    except psutil.Error:
        return True


def _end_children(timeout_s: float = 10.0) -> list[str]:
    """Terminate this process's descendants, then kill those still alive; describe them all."""
    children = [c for c in psutil.Process().children(recursive=True) if not _is_resource_tracker(c)]
    described = [_describe(c) for c in children]
    for child in children:
        try:
            child.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(children, timeout=timeout_s)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    return described


def _leftover_threads() -> list[str]:
    return [
        t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
    ]


_GROUP_SECONDS: dict[str, float] = {}
"""Seconds of every test phase (set-up, call, tear-down) by test group."""


def group_of(nodeid: str) -> str:
    """A test's group: its model family's folder (`models/wan`: the family's tests, its engines
    shared among them), else its top folder under tests/ (`cpp`, `entrypoints`, ...)."""
    parts = nodeid.split("::")[0].split("/")[1:-1]  # the folders between tests/ and the file
    if not parts:
        return "tests"
    return "/".join(parts[:2]) if parts[0] == "models" and len(parts) > 1 else parts[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = group_of(report.nodeid)
    _GROUP_SECONDS[group] = _GROUP_SECONDS.get(group, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # CI prints where the suite's time goes: each family's tests, each layer's.
    seconds = _GROUP_SECONDS
    if not seconds:
        return
    terminalreporter.section("seconds per test group")
    for group, spent in sorted(seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{spent:8.1f} s  {group}")
    terminalreporter.write_line(f"{sum(seconds.values()):8.1f} s  in all")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Every fixture has been torn down by now: a process or non-daemon thread still alive leaked
    # from a test. Name it, so that the leak can be fixed, and end the processes.
    session.config.stash[_SESSION] = session
    children = _end_children()
    threads = _leftover_threads()
    if children:
        sys.__stderr__.write("\n[conftest] processes alive after the tests, ended:\n  ")
        sys.__stderr__.write("\n  ".join(children) + "\n")
    if threads:
        sys.__stderr__.write(f"\n[conftest] non-daemon threads alive after the tests: {threads}\n")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is None:  # no test session ran (`pytest --help`, a usage error)
        return
    # Leave with pytest's status without running interpreter shutdown. That shutdown joins
    # threads, runs vLLM's and multiprocessing's exit hooks and frees native libraries' state;
    # it takes ~3 s here, but one CI run printed its summary and then hung there until its
    # 90-minute limit killed it, which turned 275 passing tests into a failure. Nothing after
    # this point can change the outcome: the report is written and leaked processes are ended.
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    os._exit(int(session.exitstatus))
