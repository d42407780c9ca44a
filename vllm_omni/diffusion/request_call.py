# SPDX-License-Identifier: Apache-2.0
"""One request's run of a diffusers pipeline's own `__call__`, paused at its model calls.

The pipeline runs on a thread of its own with a copy of the pipeline object that shares the
models but has its own scheduler (the sampler's step state) and, in place of the denoiser and
the VAE, gates: a denoiser call or a VAE decode hands its arguments to the stage's loop and
waits for the output, so the loop can run the calls of every request at that point as one
batch. The pipeline's `callback_on_step_end`, where it takes one, counts the steps made. Only
one thread runs at a time - the loop hands it the turn and waits until it pauses again - so the
pipeline's own code (its tokenizers, its encoders) never runs concurrently.

A request's thread runs its torch ops on one intra-op thread. On a CPU each thread that runs
parallel ops keeps a team of OpenMP workers of its own, and once a process holds more OpenMP
threads than cores, libgomp's workers stop spinning between ops and sleep: the stage's batched
forwards then ran as with `OMP_WAIT_POLICY=passive`, twice as long (tiny FLUX.1 on 2 cores:
+11 ms a step, the call loop at 0.5x diffusers' speed for one request; 0.85-0.93x with this,
benchmarks/diffusers_calls.py). The cost: on a CPU, a new request's text encoders run on one
core; on a GPU, nothing. (torch keeps the count it starts new threads with process-wide:
threads of the stage process that start later and set none get one too; the stage's loop
thread keeps its own.)
"""

from __future__ import annotations

import copy
import enum
import queue
import threading
from collections.abc import Mapping
from typing import Any

import torch

from vllm_omni.diffusion.batched_calls import Call, Failed


class Paused(enum.Enum):
    CALL = "call"  # at a denoiser call: `call` holds its arguments
    DECODE = "decode"  # at the VAE's decode: `call` holds its arguments
    DONE = "done"  # returned: `result` holds the pipeline's output
    FAILED = "failed"  # raised: `error` holds the exception
    CANCELLED = "cancelled"  # unwound by `cancel`


class Cancelled(Exception):
    """Raised inside a request's thread to unwind its pipeline call."""


_CANCEL = object()


class Gate:
    """Stands in for a pipeline component: calling it (`method` None) or its `method` pauses
    the request at `paused`; other attributes are the component's (`config`, `dtype` ...)."""

    def __init__(self, module: Any, run: RequestCall, paused: Paused, method: str | None) -> None:
        self._module, self._run, self._paused, self._method = module, run, paused, method

    def __getattr__(self, name: str) -> Any:
        if name == self._method:
            return self._pause
        return getattr(self._module, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._method is not None:
            return self._module(*args, **kwargs)
        return self._pause(*args, **kwargs)

    def _pause(self, *args: Any, **kwargs: Any) -> Any:
        return self._run.pause(self._paused, Call(args, kwargs))


def request_pipeline(pipe: Any, denoiser: str, run: RequestCall) -> Any:
    """A shallow copy of `pipe` (the models shared) with its own scheduler, its `denoiser`
    component and its VAE's `decode` behind gates. Set past DiffusionPipeline.__setattr__, which
    would re-register the components in the shared pipeline's config."""
    clone = copy.copy(pipe)
    object.__setattr__(clone, "scheduler", copy.deepcopy(pipe.scheduler))
    object.__setattr__(clone, denoiser, Gate(getattr(pipe, denoiser), run, Paused.CALL, None))
    object.__setattr__(clone, "vae", Gate(pipe.vae, run, Paused.DECODE, "decode"))
    clone.set_progress_bar_config(disable=True)
    return clone


class RequestCall:
    """`pipe(**kwargs)` for one request, run a piece at a time by `start` and `resume`; after
    each, `paused` says where it stopped. `denoiser`: the component whose calls pause it;
    `counts_steps`: the pipeline takes a `callback_on_step_end` (which counts `steps`)."""

    def __init__(
        self,
        pipe: Any,
        denoiser: str,
        kwargs: Mapping[str, Any],
        name: str,
        counts_steps: bool,
    ) -> None:
        self._to_thread: queue.Queue = queue.Queue(maxsize=1)
        self._from_thread: queue.Queue = queue.Queue(maxsize=1)
        self.pipe = request_pipeline(pipe, denoiser, self)
        self.kwargs = dict(kwargs)
        if counts_steps:
            self.kwargs["callback_on_step_end"] = self._step_end
        self.paused: Paused | None = None
        self.call: Call | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ------------------------------------------------------------------ the loop's side
    def start(self) -> None:
        """Run the request up to its first pause (its encoders run now)."""
        self._thread.start()
        self._wait()

    def resume(self, reply: Any = None) -> None:
        """Hand a paused request `reply` (its call's output; `Failed`: the call raises its
        error in the request's pipeline) and run it to its next pause."""
        if self.paused not in (Paused.CALL, Paused.DECODE):
            raise RuntimeError(f"resume: the request is {self.paused}, not paused")
        self._to_thread.put(reply)
        self._wait()

    def cancel(self) -> None:
        """Unwind a paused request's thread (its tensors go with it)."""
        if self.paused in (Paused.CALL, Paused.DECODE):
            self._to_thread.put(_CANCEL)
            self._wait()
        self.call = None

    @property
    def finished(self) -> bool:
        return self.paused in (Paused.DONE, Paused.FAILED)

    def _wait(self) -> None:
        self.paused, payload = self._from_thread.get()
        self.call = payload if self.paused in (Paused.CALL, Paused.DECODE) else None
        if self.paused is Paused.DONE:
            self.result = payload
        elif self.paused is Paused.FAILED:
            self.error = payload

    # ------------------------------------------------------------------ the thread's side
    def _run(self) -> None:
        torch.set_num_threads(1)  # this thread's own (see the module's doc)
        try:
            with torch.inference_mode():
                result = self.pipe(**self.kwargs)
        except Cancelled:
            self._from_thread.put((Paused.CANCELLED, None))
        except BaseException as e:  # noqa: BLE001 - handed to the loop, which decides
            self._from_thread.put((Paused.FAILED, e))
        else:
            self._from_thread.put((Paused.DONE, result))

    def pause(self, paused: Paused, payload: Any = None) -> Any:
        self._from_thread.put((paused, payload))
        reply = self._to_thread.get()
        if reply is _CANCEL:
            raise Cancelled
        if isinstance(reply, Failed):
            raise reply.error
        return reply

    def _step_end(self, pipe: Any, step: int, timestep: Any, tensors: dict) -> dict:
        self.steps += 1
        return {}
