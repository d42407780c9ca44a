# SPDX-License-Identifier: Apache-2.0
"""ARStage: an autoregressive stage on a real vLLM engine (AsyncLLM, its own core process).

With a prompt-encoder processor the engine runs as a pooling model and vLLM's model runner
returns each request's hidden states through `pooler_output`; the processor keeps the rows the
next stage needs. A generating processor (vllm_omni.engine.ar_processor.Generator) builds the
engine's prompts and drives it itself. Without one, the stage generates text. Processors come
from the model families, by registered name (a stage's `processor:`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_omni.config.combined_folder import model_with_processor
from vllm_omni.config.stage_config import StageConfig
from vllm_omni.engine.ar_processor import Generator, PromptEncoder, StageProcessor
from vllm_omni.engine.busy import BusyTracker
from vllm_omni.engine.hidden_states_tap import HiddenStatesTap
from vllm_omni.engine.kv_sizing import one_step_kv_cache_bytes
from vllm_omni.errors import FieldError
from vllm_omni.logger import init_logger
from vllm_omni.registry import processors

logger = init_logger(__name__)

ENGINE_SHUTDOWN_TIMEOUT_S = 30.0
"""How long the engine core may take to exit before vLLM kills it. vLLM's default, 5 s, was about
what its worker process alone took to exit on a 2-core CPU (the interpreter's last garbage
collections, which vllm_omni.platform.process_exit now skips: 3 s), and a core killed before it
unlinks its shared-memory queue leaks it; this is the ceiling, not the usual time."""


class ARStage:
    engine_type = "AR"

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.processor: StageProcessor | None = (
            processors()[config.processor](config) if config.processor else None
        )
        self.engine = None
        self.hidden_states: HiddenStatesTap | None = None
        self.busy = BusyTracker()
        self.num_finished = 0
        self._scheduler_stats = None  # vLLM's SchedulerStats after the engine's last step
        self._output_stopped = False

    @property
    def name(self) -> str:
        return self.config.name

    def engine_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.processor is not None:
            args.update(self.processor.engine_defaults())
        args.update(self.config.engine_args)
        args["model"] = self.config.model
        if self.config.hf_processor is not None:
            args["model"] = model_with_processor(self.config.model, self.config.hf_processor)
        if self.config.tokenizer is not None and not _has_tokenizer(args["model"]):
            args.setdefault("tokenizer", self.config.tokenizer)
        if not args.get("skip_tokenizer_init") and "tokenizer" not in args:
            if Path(args["model"]).is_dir() and not _has_tokenizer(args["model"]):
                # vLLM would start and then fail every request with "prompt cannot be empty".
                raise FieldError(
                    f"stages.{self.name}.tokenizer",
                    f"{self.config.model} holds no tokenizer "
                    "(tokenizer_config.json); name its folder, e.g. `tokenizer: tokenizer` for "
                    "a diffusers pipeline's text encoder",
                )
        if self.is_encoder and args.get("dtype", "auto") == "auto":
            # vLLM's `auto` computes a float32 checkpoint in float16; an encoder's rows feed
            # another model, which diffusers gives them in the checkpoint's own dtype.
            if _checkpoint_dtype(args["model"]) == "float32":
                args["dtype"] = "float32"
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
        engine_args = AsyncEngineArgs(**self.engine_args())
        vllm_config = engine_args.create_engine_config()
        if self.is_encoder and engine_args.kv_cache_memory_bytes is None:
            # An encoder keeps nothing between requests: one step's worth of KV cache, not the
            # generation default (GiBs of memory that would never hold anything).
            vllm_config.cache_config.kv_cache_memory_bytes = one_step_kv_cache_bytes(vllm_config)
            logger.info(
                "AR stage %r: KV cache %.1f MiB (one step of a pooling encoder)",
                self.name,
                vllm_config.cache_config.kv_cache_memory_bytes / 2**20,
            )
        self.engine = AsyncLLM.from_vllm_config(
            vllm_config,
            stat_loggers=[self._stats_recorder],
            enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=engine_args.disable_log_stats,
        )
        if isinstance(self.processor, Generator) and self.processor.hands_on_hidden_states:
            self.hidden_states = HiddenStatesTap(self.engine)
        logger.info("AR stage %r: vLLM engine up in %.1f s", self.name, time.perf_counter() - start)

    @property
    def is_encoder(self) -> bool:
        return isinstance(self.processor, PromptEncoder)

    @property
    def takes_user_params(self) -> bool:
        """Whether one SamplingParams given for a whole request reaches this stage."""
        if isinstance(self.processor, Generator):
            return self.processor.takes_user_params
        return self.processor is None

    @property
    def takes_messages(self) -> bool:
        return isinstance(self.processor, Generator) and self.processor.takes_messages

    @property
    def request_options(self) -> tuple[str, ...]:
        return self.processor.request_options if self.processor is not None else ()

    def takes_params(self, params: Any) -> bool:
        """Whether one parameter object given for a whole request is this stage's."""
        from vllm import SamplingParams

        return isinstance(params, SamplingParams) and self.takes_user_params

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        return {}

    def _stats_recorder(self, vllm_config, engine_index: int = 0):
        """A vLLM stat logger that keeps this stage's latest scheduler stats. (vLLM's own
        Prometheus logger is process-wide: a second engine in the process replaces the first
        one's metrics, so the stage keeps its own.)"""
        from vllm.v1.metrics.loggers import StatLoggerBase

        stage = self

        class Recorder(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                if scheduler_stats is not None:
                    stage._scheduler_stats = scheduler_stats

            def log_engine_initialized(self) -> None:
                pass

        return Recorder(vllm_config, engine_index)

    def validate(self, params: Any, inputs: dict[str, Any] | None = None) -> Any:
        """The request's parameters for this stage; `inputs` (the prompt mapping) carries the
        request options its processor checks."""
        from vllm import SamplingParams

        if self.is_encoder:
            return None  # a prompt encoder takes no per-request parameters
        if isinstance(self.processor, Generator) and inputs:
            self.processor.check_options(inputs)
        if params is None:  # a generating processor may have defaults of its own
            default = self.processor.default_params() if self.processor is not None else None
            return default if default is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise FieldError(
                f"sampling_params.{self.name}",
                f"an AR stage takes vllm.SamplingParams, got {type(params).__name__}",
            )
        return params

    async def run(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: Any,
        emit: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """`emit`, if given, hears partial outputs of a generating processor (text deltas)."""
        self.busy.enter()  # occupancy: from submission until the output is back
        try:
            if self.is_encoder:
                out = await self._encode(request_id, inputs)
            elif self.processor is not None:
                out = await self.processor.run(self, request_id, inputs, params, emit)
            else:
                out = await self._generate(request_id, inputs, params)
        finally:
            self.busy.exit()
        self.num_finished += 1
        return out

    async def _encode(self, request_id: str, inputs: dict[str, Any]) -> dict[str, Any]:
        from vllm import PoolingParams, TextPrompt, TokensPrompt

        tokenizer = self.engine.get_tokenizer()
        images = self.processor.images(inputs)

        async def encode(tensor_name: str, text: str):
            final = None
            params = PoolingParams(task="token_embed")
            if images:  # vLLM's processor expands the image placeholders: no cut token ids
                prompt = TextPrompt(prompt=text, multi_modal_data={"image": images})
            else:
                ids = tokenizer.encode(text)[: self.processor.max_input_tokens]
                prompt = TokensPrompt(prompt_token_ids=ids)
            async for out in self.engine.encode(prompt, params, f"{request_id}/{tensor_name}"):
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

    @property
    def is_alive(self) -> bool:
        return self.engine is not None and not self.engine.errored

    def stats(self) -> dict[str, Any]:
        """The engine's latest scheduler state (KV cache usage, queue depths) and counters."""
        out: dict[str, Any] = {"num_finished": self.num_finished}
        if self.engine is not None:
            out["kv_cache_memory_bytes"] = (
                self.engine.vllm_config.cache_config.kv_cache_memory_bytes
            )
            # Requests the engine holds now (its last step's counts below may be older).
            out["num_unfinished"] = self.engine.output_processor.get_num_unfinished_requests()
        last = self._scheduler_stats
        if last is not None:
            out.update(
                kv_cache_usage=last.kv_cache_usage,
                num_running=last.num_running_reqs,
                num_waiting=last.num_waiting_reqs,
            )
        return out

    def stop_output_handler(self) -> None:
        """Stop the engine's output handler, which would report the core's exit as an engine
        failure. On the engine's event loop, so that nothing runs between this and shutdown."""
        handler = getattr(self.engine, "output_handler", None)
        if handler is not None:
            handler.cancel()
        self._output_stopped = True

    def shutdown(self) -> None:
        """Blocking, up to ENGINE_SHUTDOWN_TIMEOUT_S. On the engine's loop, or on another thread
        after `stop_output_handler` ran on the loop (OmniEngine.shutdown)."""
        if self.engine is not None:
            if not self._output_stopped:
                self.stop_output_handler()
            self.engine.shutdown(timeout=ENGINE_SHUTDOWN_TIMEOUT_S)
            self.engine = None


def _checkpoint_dtype(folder: str) -> str | None:
    """The dtype a local transformers checkpoint says its weights are in (None: not said)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    for section in (config, config.get("text_config") or {}):
        dtype = section.get("dtype") or section.get("torch_dtype")
        if dtype:
            return str(dtype)
    return None


def _has_tokenizer(folder: str) -> bool:
    # vLLM probes a separate tokenizer folder for a model config too (and retries, slowly,
    # when it has none), so a model folder that carries its tokenizer is used as is.
    return (Path(folder) / "tokenizer_config.json").is_file()
