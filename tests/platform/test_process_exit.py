# SPDX-License-Identifier: Apache-2.0
"""A process started by multiprocessing (vLLM's engine core and workers) exits without the final
garbage collections once the plugin armed it; the user's own process keeps them."""

import multiprocessing
import sys

import pytest


class _Cycle:
    """A reference cycle whose finalizer only the garbage collector can run."""

    def __init__(self, marker: str):
        self.marker = marker
        self.me = self

    def __del__(self, _open=open):  # late in finalization the builtins may be gone
        with _open(self.marker, "w") as f:
            f.write("collected")


def _child(marker: str, arm: bool) -> None:
    import gc

    gc.disable()  # no automatic collection before exit: only the exit ones can find the cycle
    if arm:
        from vllm_omni.platform.process_exit import skip_final_gc_in_child_processes

        skip_final_gc_in_child_processes()
    _Cycle(marker)  # garbage at once, but only a collection finds it


@pytest.mark.parametrize("arm", [False, True], ids=["plain", "armed"])
def test_child_skips_the_final_collections(tmp_path, arm):
    marker = tmp_path / "marker"
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_child, args=(str(marker), arm))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    # Without the hook the interpreter's exit collections run the cycle's finalizer.
    assert marker.exists() is (not arm)


def test_the_main_process_is_left_alone(monkeypatch):
    import atexit

    from vllm_omni.platform import process_exit

    registered = []
    monkeypatch.setattr(process_exit, "_armed", False)
    monkeypatch.setattr(atexit, "register", registered.append)
    process_exit.skip_final_gc_in_child_processes()
    assert registered == [] and multiprocessing.parent_process() is None, sys.argv
