# SPDX-License-Identifier: Apache-2.0
"""RayARStage: an AR stage whose whole engine runs in a Ray actor (`backend: ray`).

The actor, placed by the stage's `resources`, holds an ordinary ARStage: vLLM's AsyncLLM with
its engine core (scheduler, KV cache manager) and workers as the actor's child processes on the
actor's node, and the stage's processor beside it (chat rendering, hidden states, the talker's
segments). The orchestrator keeps a RayARStage, which checks parameters with its own copy of
the processor and forwards each request:

- the request's inputs go as call arguments (Ray moves large tensors through its object store);
- every output comes back as an object ref of one streaming generator call: the stage's
  partial outputs (text deltas, the thinker's newest hidden states, the talker's newest codes)
  when someone listens, then the final output;
- a streaming stage (`stream_input`) reads its source as it goes: the orchestrator forwards
  each item its upstream yields, one call each;
- a cancelled request is aborted in the actor, which cancels it in the engine (KV blocks
  freed); a dead actor fails the requests it held and `/health` names the stage.

`executor: ray` in the same stage also puts the engine's workers on Ray (vLLM's Ray executor,
for a stage that spans nodes); otherwise they are the actor's child processes.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from vllm_omni.config.stage_config import StageConfig
from vllm_omni.engine.ar_stage import ENGINE_SHUTDOWN_TIMEOUT_S, ARStage
from vllm_omni.engine.process_host import actor_location, actor_options, join_ray, wait_placed
from vllm_omni.engine.stage_stream import StageStream
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

START_TIMEOUT_S = 600.0
WATCH_INTERVAL_S = 0.5
"""How often the actor checks that its engine still runs (a dead engine ends `lifetime`)."""
MAX_ENDED_REMEMBERED = 4096


class ARStageError(RuntimeError):
    pass


def _portable(error: Exception) -> Exception:
    """An error a call can raise to the orchestrator: what a call raises travels pickled, and
    some errors cannot be (pydantic's, on a bad engine argument); those become the same kind
    of error, with their message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        kind = ValueError if isinstance(error, ValueError) else RuntimeError
        return kind(f"{type(error).__name__}: {error}")


def _drain(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


class ARStageActor:
    """The Ray actor an AR stage runs in (an async actor: `ray.remote` at placement)."""

    def __init__(self, config: StageConfig) -> None:
        self.stage = ARStage(config)
        self._feeds: dict[str, StageStream] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        # Requests that have ended: an upstream item still on its way for one is dropped.
        self._done: OrderedDict[str, None] = OrderedDict()
        self._ended: asyncio.Event | None = None

    def _ended_event(self) -> asyncio.Event:
        if self._ended is None:  # made on the actor's event loop, by whichever call comes first
            self._ended = asyncio.Event()
        return self._ended

    async def ready(self) -> dict[str, Any]:
        return actor_location()

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.stage.start)
        except Exception as e:
            raise _portable(e) from None
        asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while self.stage.is_alive:
            await asyncio.sleep(WATCH_INTERVAL_S)
        self._ended_event().set()

    async def lifetime(self) -> None:
        """Returns when the stage's engine stops (or the actor dies: then the call fails)."""
        await self._ended_event().wait()

    async def run(
        self, request_id: str, inputs: dict[str, Any], params: Any, listen: bool, fed: bool
    ):
        """A streaming generator: ("deltas", [partial output, ...])..., then ("output", output).
        Deltas made while the caller fetched the last batch go together: one object each would
        cost a round trip per token."""
        if fed:
            inputs = {**inputs, "upstream": self._feed(request_id)}
        deltas: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        emit = deltas.put_nowait if listen else None
        task = asyncio.ensure_future(self.stage.run(request_id, inputs, params, emit))
        self._tasks[request_id] = task
        try:
            while not task.done():
                getter = asyncio.ensure_future(deltas.get())
                await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield "deltas", [getter.result(), *_drain(deltas)]
                else:
                    getter.cancel()
            if not deltas.empty():
                yield "deltas", _drain(deltas)
            if not task.cancelled() and task.exception() is not None:
                raise _portable(task.exception())
            yield "output", task.result()
        finally:
            task.cancel()
            self._end(request_id)

    def _feed(self, request_id: str) -> StageStream:
        # Items come renamed by the orchestrator's StageStream: passed on as they are. The first
        # may come before the request itself.
        if request_id not in self._feeds:
            names = self.stage.config.inputs
            self._feeds[request_id] = StageStream({name: name for name in names})
        return self._feeds[request_id]

    def _end(self, request_id: str) -> None:
        self._tasks.pop(request_id, None)
        self._feeds.pop(request_id, None)
        self._done[request_id] = None
        if len(self._done) > MAX_ENDED_REMEMBERED:
            self._done.popitem(last=False)

    async def feed(self, request_id: str, outputs: dict[str, Any], final: bool) -> None:
        if request_id not in self._done:
            self._feed(request_id).put(outputs, final)

    async def abort(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()
        self._end(request_id)

    async def stats(self) -> dict[str, Any]:
        # num_in_actor: requests the actor runs (one may wait for its upstream, in no engine).
        return {**self.stage.stats(), "num_in_actor": len(self._tasks)}

    async def shutdown(self) -> None:
        self.stage.stop_output_handler()  # on the engine's loop, as OmniEngine does locally
        await asyncio.to_thread(self.stage.shutdown)
        self._ended_event().set()


class RayARStage(ARStage):
    """The orchestrator's side: same interface as ARStage, the engine in a Ray actor."""

    def __init__(self, config: StageConfig) -> None:
        super().__init__(config)  # the processor, here too: parameters are checked before sending
        self.actor = None
        self.placement: dict[str, Any] = {}  # the actor's pid and Ray node id
        self._life = None  # the actor's `lifetime` call: ready once the stage is gone

    def start(self) -> None:
        """Blocking: places the actor and starts the engine in it."""
        import ray
        from ray.exceptions import RayTaskError

        start = time.perf_counter()
        join_ray()
        options = actor_options(self.name, self.config.resources, id(self))
        self.actor = ray.remote(ARStageActor).options(**options).remote(self.config)
        self.placement = wait_placed(self.actor, self.name, self.config.resources)
        try:
            ray.get(self.actor.start.remote(), timeout=START_TIMEOUT_S)
        except Exception as e:
            ray.kill(self.actor)
            self.actor = None
            if isinstance(e, RayTaskError) and isinstance(e.cause, Exception):
                raise e.cause from None  # the engine's own error, e.g. a bad engine argument
            raise ARStageError(f"AR stage {self.name!r}: the Ray actor did not start: {e}") from e
        self._life = self.actor.lifetime.remote()
        logger.info(
            "AR stage %r: vLLM engine up in a Ray actor (node %s) in %.1f s",
            self.name,
            self.placement["node_id"][:12],
            time.perf_counter() - start,
        )

    async def run(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: Any,
        emit: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        from ray.exceptions import RayActorError, RayTaskError

        upstream = inputs.get("upstream")
        sent = {k: v for k, v in inputs.items() if k != "upstream"}
        self.busy.enter()
        feeder, out, finished = None, None, False
        try:
            outputs = self.actor.run.options(num_returns="streaming").remote(
                request_id, sent, params, emit is not None, upstream is not None
            )
            if upstream is not None:
                feeder = asyncio.ensure_future(self._forward(request_id, upstream))
            async for ref in outputs:
                kind, data = await ref
                if kind == "deltas":
                    for delta in data:
                        emit(delta)
                else:
                    out, finished = data, True
        except RayActorError as e:
            raise self._died(e) from e
        except RayTaskError as e:  # the stage's own error (e.g. a prompt too long), as is
            if isinstance(e.cause, Exception):
                raise e.cause from None
            raise
        finally:
            if not finished:  # cancelled, or failed here: frees its KV blocks there
                self.actor.abort.remote(request_id)
            if feeder is not None:
                feeder.cancel()
            self.busy.exit()
        self.num_finished += 1
        return out

    async def _forward(self, request_id: str, upstream) -> None:
        try:
            async for outputs, final in upstream:
                await self._get(self.actor.feed.remote(request_id, outputs, final))
        except ARStageError:
            pass  # the actor died: the request's own call reports it

    async def _get(self, ref) -> Any:
        from ray.exceptions import RayActorError

        try:
            return await ref
        except RayActorError as e:
            raise self._died(e) from e

    def _died(self, error: Exception) -> ARStageError:
        first_line = str(error).splitlines()[0][:200] if str(error) else ""
        return ARStageError(
            f"AR stage {self.name!r}: Ray actor died ({type(error).__name__}: {first_line})"
        )

    @property
    def is_alive(self) -> bool:
        import ray

        if self._life is None:
            return False
        ready, _ = ray.wait([self._life], timeout=0)
        return not ready

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_finished": self.num_finished}
        if self.is_alive:
            out.update(await self._get(self.actor.stats.remote()))
        return out

    def stop_output_handler(self) -> None:
        pass  # the actor stops its engine's handler itself, on its own loop

    def shutdown(self) -> None:
        """Blocking, up to ENGINE_SHUTDOWN_TIMEOUT_S and a little more."""
        import ray

        if self.actor is None:
            return
        try:
            if self.is_alive:
                ray.get(self.actor.shutdown.remote(), timeout=ENGINE_SHUTDOWN_TIMEOUT_S + 5)
        except Exception:
            logger.warning("AR stage %r: the Ray actor did not stop its engine", self.name)
        finally:
            ray.kill(self.actor)  # its children (the engine core) go with it
            self.actor = None


def make_ar_stage(config: StageConfig) -> ARStage:
    return RayARStage(config) if config.backend == "ray" else ARStage(config)
