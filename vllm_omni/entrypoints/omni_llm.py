# SPDX-License-Identifier: Apache-2.0
"""OmniLLM: the offline API over a stage graph, as simple to call as vLLM's `LLM`.

    from vllm_omni import OmniLLM, DiffusionSamplingParams
    omni = OmniLLM(model="path/to/Qwen-Image")
    outputs = omni.generate(["a red cat"], DiffusionSamplingParams(height=512, width=512, seed=0))
    outputs[0].images[0].save("cat.png")

The engine runs on a private asyncio loop in a background thread, so requests flow through the
stages concurrently while `generate` waits with a progress bar.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vllm_omni.config.model_defaults import resolve_stage_graph
from vllm_omni.config.stage_config import StageGraph
from vllm_omni.engine.omni_engine import OmniEngine
from vllm_omni.outputs import OmniRequestOutput

Prompt = str | Mapping[str, str]


class OmniLLM:
    """`model`: a model folder or a Hugging Face hub repo id (e.g. "Qwen/Qwen-Image", found in
    or fetched into huggingface_hub's cache, or `download_dir`, at `revision`); its stage graph
    is built in (see `config/model_defaults.py`) unless `stage_configs` gives one (YAML path,
    dict or StageGraph). `stage_overrides` patches stages by name, e.g.
    `{"dit": {"dit": {"max_num_seqs": 16}}}`."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        stage_configs: str | Path | StageGraph | Mapping | None = None,
        stage_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        revision: str | None = None,
        download_dir: str | Path | None = None,
    ) -> None:
        self.graph = resolve_stage_graph(
            model, stage_configs, stage_overrides, revision=revision, download_dir=download_dir
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="OmniLLM", daemon=True)
        self._thread.start()
        self.engine = OmniEngine(self.graph)
        try:
            self._call(self.engine.start())
        except BaseException:
            self._stop_loop()
            raise

    # ------------------------------------------------------------------ API
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: Any = None,
        *,
        use_tqdm: bool = True,
    ) -> list[OmniRequestOutput]:
        """Run every prompt through the graph; outputs come back in prompt order.

        `sampling_params`, as in vLLM's `LLM.generate`: one entry for every prompt, or a list
        with one entry per prompt. An entry is one object for the stages it fits (e.g.
        DiffusionSamplingParams for DiT stages) or a dict {stage name: params}."""
        prompts = list(prompts) if isinstance(prompts, (list, tuple)) else [prompts]
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(
                    f"sampling_params: a list needs one entry per prompt ({len(prompts)}), "
                    f"got {len(sampling_params)}"
                )
            per_prompt = list(sampling_params)
        else:
            per_prompt = [sampling_params] * len(prompts)
        prepared = [self.engine.prepare(p, sp) for p, sp in zip(prompts, per_prompt)]  # fail fast
        futures = [self._submit(self.engine.run_prepared(*x)) for x in prepared]
        bar = tqdm(total=len(futures), desc="Generating", unit="req", disable=not use_tqdm)
        try:
            for future in futures:
                future.add_done_callback(lambda _: bar.update())
            return [f.result() for f in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        finally:
            bar.close()

    def add_request(
        self, prompt: Prompt, sampling_params: Any = None, request_id: str | None = None
    ) -> Future:
        """Start one request without waiting; the Future resolves to its OmniRequestOutput."""
        inputs, params = self.engine.prepare(prompt, sampling_params)
        return self._submit(self.engine.run_prepared(inputs, params, request_id))

    def abort(self, request_id: str) -> bool:
        """Cancel a request in every stage; its KV blocks and DiT cache entry are freed."""
        return self._call(_async(self.engine.abort, request_id))

    def get_stage_stats(self) -> dict[str, Any]:
        """Per-stage state: queue depths, DiT cache entries/bytes, KV cache usage, counters."""
        return self._call(self.engine.stats())

    def shutdown(self) -> None:
        if self._loop.is_closed():
            return
        self._call(_async(self.engine.shutdown))  # on the engine's loop (see ARStage.shutdown)
        self._stop_loop()

    def __enter__(self) -> OmniLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ plumbing
    def _submit(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro, timeout: float | None = None):
        return self._submit(coro).result(timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


async def _async(fn, *args):
    return fn(*args)
