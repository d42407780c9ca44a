# SPDX-License-Identifier: Apache-2.0
"""vLLM's engine-core and worker processes exit without the interpreter's last garbage
collections.

Measured on a 2-core CPU (tiny 8-layer Llama, PP=1, float32): after its explicit shutdown a worker
spent over 3 s at full CPU in those collections (py-spy: `gc_collect_main` during finalization),
so vLLM's 5 s grace ran out and the engine core was killed before its own clean-up; every engine
shutdown took 5.0 s (stock vLLM too). The collections only free memory that the kernel frees
anyway when the process ends: what must be released (shared memory, sockets, files) vLLM and
vllm_omni release explicitly before. Freezing the heap at exit (everything alive then moves to
the permanent generation, which no collection visits) takes them out: 3.2 s, most of it the KV
cache's unmapping, and the core unlinks its queues itself. The user's own process (the one that
runs `LLM(...)` or the server) is left alone.
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing

_armed = False


def skip_final_gc_in_child_processes() -> None:
    """In a process started by multiprocessing, freeze the heap at exit; idempotent."""
    global _armed
    if _armed or multiprocessing.parent_process() is None:
        return
    # atexit runs its hooks last-registered first: hooks added later (vLLM's, weakref
    # finalizers) still run, and the freeze comes before the interpreter's final collections.
    atexit.register(gc.freeze)
    _armed = True
