# SPDX-License-Identifier: Apache-2.0
"""Every vLLM patch still matches the vLLM function it wraps, and takes effect."""

import os
import threading
import time

import pytest
import torch

from vllm_omni import _patches, plugin


@pytest.mark.parametrize("patch", _patches.all_patches(), ids=lambda p: p.name)
def test_patched_vllm_function_is_unchanged(patch):
    # Fails when vLLM changes under a patch: review the patch, then update its fingerprint.
    owner = getattr(patch.owner, "__qualname__", patch.owner.__name__)
    assert patch.current_fingerprint() == patch.fingerprint, (
        f"{owner}.{patch.attr} changed; review patch {patch.name}"
    )


@pytest.mark.parametrize("pinned", _patches.all_pinned(), ids=lambda p: p.attr)
def test_pinned_vllm_internal_is_unchanged(pinned):
    # Fails when vLLM changes a function vllm_omni wraps on its own instances: review `why`.
    assert pinned.current_fingerprint() == pinned.fingerprint, (
        f"{pinned.owner.__qualname__}.{pinned.attr} changed; {pinned.why}"
    )


def test_register_applies_every_patch_on_cpu():
    plugin.register()
    for patch in _patches.all_patches():
        assert patch.is_applied(), patch.name
        # Applying again is a no-op and keeps a single wrapper layer.
        assert patch.apply()
        assert not hasattr(patch.original(), "__vllm_omni_original__")
        assert patch._unwrapped().__vllm_omni_original__ is patch.original()


def test_cpu_pp_eager_buffer_is_allocated_on_non_first_rank(monkeypatch):
    from vllm.distributed import parallel_state

    class FakeModel:
        def make_empty_intermediate_tensors(self, batch_size, dtype, device):
            return {"hidden_states": torch.zeros(batch_size, 4, dtype=dtype, device=device)}

    class FakeRunner:
        intermediate_tensors = None
        model = FakeModel()
        max_num_tokens = 8
        device = torch.device("cpu")

        class model_config:  # noqa: N801
            dtype = torch.bfloat16

    calls = []
    load_model = _patches._wrap_cpu_load_model(lambda self: calls.append(self))

    class Rank:
        def __init__(self, first):
            self.is_first_rank = first

    runner = FakeRunner()
    monkeypatch.setattr(parallel_state, "get_pp_group", lambda: Rank(first=True))
    load_model(runner)
    assert calls == [runner] and runner.intermediate_tensors is None

    monkeypatch.setattr(parallel_state, "get_pp_group", lambda: Rank(first=False))
    load_model(runner)
    buffer = runner.intermediate_tensors["hidden_states"]
    assert buffer.shape == (8, 4) and buffer.dtype == torch.bfloat16


def test_cpp_deepens_the_batch_queue_only_for_cpp_engines():
    from types import SimpleNamespace

    from vllm.config import VllmConfig

    plugin.register()

    def config(pp, additional, async_scheduling=False):
        fake = SimpleNamespace(
            parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
            additional_config=additional,
            use_v2_model_runner=False,
        )
        return VllmConfig.max_concurrent_batches.fget(fake)

    assert config(2, {}) == 2  # plain vLLM: untouched
    assert config(2, {"cpp": {}}) == 3
    assert config(4, {"cpp": {"lookahead_steps": 0}}) == 4
    assert config(1, {"cpp": {}}) == 1


def test_shm_reader_naps_after_a_short_spin():
    calls = []

    def original(self, timeout_ms=None):
        calls.append((self.busy_loop_s, timeout_ms))

    wait = _patches._wrap_shm_wait(original)

    class Condition:
        busy_loop_s = 1.0
        last_read = 0.0

    c = Condition()
    c.last_read = time.monotonic()  # just read: spins as vLLM does
    wait(c, None)
    c.last_read = time.monotonic() - 0.1  # inside vLLM's busy window: a bounded sleep
    wait(c, None)
    wait(c, 5000)
    wait(c, 3)
    c.last_read = time.monotonic() - 5  # idle: vLLM's own wait
    wait(c, 5000)
    nap = _patches.SHM_NAP_MS
    assert calls == [(1.0, None), (0.0, nap), (0.0, nap), (0.0, 3), (1.0, 5000)]
    assert c.busy_loop_s == 1.0


def test_shm_queue_reader_sleeps_while_it_waits():
    # A real vLLM message queue: between messages its reader thread stays off the CPU (vLLM
    # alone spins for 1 s after each read), and still gets the next message at once.
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    plugin.register()
    writer = MessageQueue(n_reader=1, n_local_reader=1)
    handle = writer.export_handle()
    seen = []

    def read() -> None:
        reader = MessageQueue.create_from_handle(handle, 0)
        reader.wait_until_ready()
        for _ in range(2):
            cpu, wall = time.thread_time(), time.monotonic()
            message = reader.dequeue()
            seen.append((message, time.thread_time() - cpu, time.monotonic() - wall))

    thread = threading.Thread(target=read)
    thread.start()
    writer.wait_until_ready()
    writer.enqueue("first")
    time.sleep(0.6)
    writer.enqueue("second")
    thread.join(timeout=10)
    assert [m for m, _, _ in seen] == ["first", "second"]
    _, cpu_s, wall_s = seen[1]
    assert 0.5 < wall_s < 3  # it waited for the message, and was not left to vLLM's 5 s recheck
    assert cpu_s < 0.15, f"the reader spun: {cpu_s:.2f} s of CPU in {wall_s:.2f} s"


def test_cpu_shm_unlink_removes_only_the_groups_names(tmp_path, monkeypatch):
    group = "vllm_dist_ab12-pp:0-[0-1]-cpushm"  # brackets: glob metacharacters, matched as is
    for name in (f"{group}_0", f"{group}_1", "vllm_dist_ab12-pp:0-[0-2]-cpushm_0", "other"):
        (tmp_path / name).write_bytes(b"x")
    monkeypatch.setattr(_patches, "SHM_DIR", str(tmp_path))
    calls = []

    class Group:
        group_name = group

    init = _patches._wrap_init_cpu_shm(lambda self: calls.append(sorted(os.listdir(tmp_path))) or 7)
    assert init(Group()) == 7
    assert len(calls[0]) == 4  # vLLM's set-up ran first, with every segment there
    assert sorted(os.listdir(tmp_path)) == ["other", "vllm_dist_ab12-pp:0-[0-2]-cpushm_0"]
    assert _patches.unlink_cpu_shm(group) == []  # another rank was first: nothing to do


def test_a_tokenizer_folder_without_a_model_config_is_not_parsed(tmp_path, tiny_models):
    from vllm.tokenizers import registry

    calls = []
    get_config = _patches._wrap_tokenizer_get_config(lambda model, **kw: calls.append(model))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="no model config"):
        get_config(str(tmp_path), trust_remote_code=False)
    assert calls == []  # vLLM's parser (which sleeps 2 s before retrying) never ran
    (tmp_path / "config.json").write_text("{}")
    get_config(str(tmp_path))
    get_config("Qwen/Qwen-Image")  # a hub id: vLLM's own
    assert calls == [str(tmp_path), "Qwen/Qwen-Image"]
    # vLLM's tokenizer loader, patched, still loads a diffusers checkpoint's tokenizer folder
    plugin.register()
    tokenizer = registry.get_tokenizer(str(tiny_models["z-image"] / "tokenizer"))
    assert tokenizer.encode("a red cat")
