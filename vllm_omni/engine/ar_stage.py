# SPDX-License-Identifier: Apache-2.0
"""ARStage: an autoregressive stage on a real vLLM engine (AsyncLLM, its own core process).

With a processor (e.g. `qwen_image_prompt`) the engine runs as a pooling model and vLLM's
model runner returns each request's hidden states through `pooler_output`; the processor
keeps the rows the next stage needs. Without one, the stage generates text.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from vllm_omni.config.stage_config import StageConfig
from vllm_omni.engine.busy import BusyTracker
from vllm_omni.engine.stage_processors import PROCESSORS
from vllm_omni.logger import init_logger

logger = init_logger(__name__)


class ARStage:
    engine_type = "AR"

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.processor = PROCESSORS[config.processor] if config.processor else None
        self.engine = None
        self.busy = BusyTracker()
        self.num_finished = 0

    @property
    def name(self) -> str:
        return self.config.name

    def engine_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.processor is not None:
            args.update(self.processor.engine_defaults())
        args.update(self.config.engine_args)
        args["model"] = self.config.model
        if self.config.tokenizer is not None:
            args.setdefault("tokenizer", self.config.tokenizer)
        if self.config.executor != "auto":
            args["distributed_executor_backend"] = self.config.executor
        if self.config.scheduler == "cpp":
            from vllm_omni.cpp.engine_args import cpp_engine_args

            args = cpp_engine_args(args.pop("cpp", None), **args)
        return args

    def start(self) -> None:
        """Blocking: builds the engine (its core process loads the model)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        start = time.perf_counter()
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.engine_args()))
        logger.info("AR stage %r: vLLM engine up in %.1f s", self.name, time.perf_counter() - start)

    def validate(self, params: Any) -> Any:
        from vllm import SamplingParams

        if self.processor is not None:
            return None  # a prompt encoder takes no per-request parameters
        if params is None:
            return SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"sampling_params.{self.name}: an AR stage takes vllm.SamplingParams, "
                f"got {type(params).__name__}"
            )
        return params

    async def run(self, request_id: str, inputs: dict[str, Any], params: Any) -> dict[str, Any]:
        self.busy.enter()  # occupancy: from submission until the output is back
        try:
            if self.processor is not None:
                out = await self._encode(request_id, inputs)
            else:
                out = await self._generate(request_id, inputs, params)
        finally:
            self.busy.exit()
        self.num_finished += 1
        return out

    async def _encode(self, request_id: str, inputs: dict[str, Any]) -> dict[str, Any]:
        from vllm import PoolingParams

        async def encode(tensor_name: str, text: str):
            final = None
            params = PoolingParams(task="token_embed")
            async for out in self.engine.encode(text, params, f"{request_id}/{tensor_name}"):
                final = out
            return tensor_name, self.processor.output(final.outputs.data)

        prompts = self.processor.prompts(inputs)
        return dict(await asyncio.gather(*(encode(n, t) for n, t in prompts.items())))

    async def _generate(self, request_id: str, inputs: dict[str, Any], params) -> dict[str, Any]:
        final = None
        async for out in self.engine.generate(inputs["prompt"], params, request_id):
            final = out
        completion = final.outputs[0]
        return {"text": completion.text, "token_ids": list(completion.token_ids)}

    def stats(self) -> dict[str, Any]:
        from vllm.v1.metrics.reader import get_metrics_snapshot

        wanted = {
            "vllm:kv_cache_usage_perc": "kv_cache_usage",
            "vllm:num_requests_running": "num_running",
            "vllm:num_requests_waiting": "num_waiting",
        }
        out: dict[str, Any] = {"num_finished": self.num_finished}
        for metric in get_metrics_snapshot():
            if metric.name in wanted and metric.labels.get("model_name") == self.config.model:
                out[wanted[metric.name]] = metric.value
        return out

    def shutdown(self) -> None:
        if self.engine is not None:
            # Stop the output handler before the core goes, or it reports the core's exit as
            # an engine failure. Called on the engine's event loop, so nothing runs between.
            handler = getattr(self.engine, "output_handler", None)
            if handler is not None:
                handler.cancel()
            self.engine.shutdown()
            self.engine = None
