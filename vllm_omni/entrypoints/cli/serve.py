# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni serve MODEL` / `vllm serve MODEL --omni`: vLLM's serve command plus omni options
(`--cpp` and `--cpp-*`: chunked pipeline parallelism, see vllm_omni.cpp).

MODEL is a folder or a Hugging Face hub repo id (resolved through huggingface_hub's cache, with
--revision, --download-dir, HF_HUB_OFFLINE and HF_TOKEN, config/model_source.py). A plain
language model is served by vLLM's own OpenAI server (all of vLLM's flags apply). A diffusers
pipeline (`model_index.json`), a transformers model with a built-in graph (Qwen2.5-Omni), or any
model given `--stage-configs`, is served by the omni server over its stage graph
(vllm_omni.entrypoints.openai.api_server); of vLLM's flags it uses --host, --port, --api-key,
--served-model-name, --revision, --download-dir, --uvicorn-log-level, and passes --enforce-eager,
--dtype, --max-model-len, --cpp and -pp on to the graph's AR stages.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm.entrypoints.cli.serve import ServeSubcommand

from vllm_omni.cpp.cli import add_cpp_args, apply_cpp_args
from vllm_omni.cpp.config import CONFIG_KEY as CPP_CONFIG_KEY
from vllm_omni.entrypoints.openai.api_server import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_REQUEST_STEPS,
    DEFAULT_MAX_VIDEO_FRAMES,
    DEFAULT_MAX_VIDEO_JOBS,
    DEFAULT_MAX_VIDEO_STORAGE_MB,
    DEFAULT_VIDEO_TTL_S,
)
from vllm_omni.logger import init_logger

logger = init_logger(__name__)


def is_multi_stage(
    model: str, revision: str | None = None, download_dir: str | None = None
) -> bool:
    """A diffusers pipeline, or a transformers model with a graph of its own (Qwen2.5-Omni);
    a plain language model is served by vLLM's own server. `model` is a folder or a hub repo id,
    judged from its config files alone (no weights are fetched). A local file or folder that is
    neither kind is left to vLLM (GGUF, Mistral's format); a hub repo that cannot be read, or
    is neither kind, and a diffusers pipeline no graph serves, are errors naming it."""
    from vllm_omni.config.model_defaults import inspect_model
    from vllm_omni.config.model_source import is_local

    try:
        model_type = inspect_model(model, revision=revision, download_dir=download_dir)
    except ValueError as e:
        if is_local(model) and not (Path(model) / "model_index.json").is_file():
            return False  # a diffusers pipeline is ours to refuse: vLLM serves none
        raise SystemExit(f"vllm-omni serve: error: {e}") from None
    return model_type != "lm"


class OmniServeCommand(ServeSubcommand):
    """vLLM's `serve` subcommand, extended with model-type detection for omni stage graphs."""

    def subparser_init(self, subparsers: argparse._SubParsersAction):
        parser = super().subparser_init(subparsers)
        parser.usage = "vllm-omni serve [model_tag] [options]   (or: vllm serve [model_tag] --omni)"
        add_cpp_args(parser)
        omni = parser.add_argument_group("omni stage graphs")
        omni.add_argument(
            "--stage-configs",
            default=None,
            help="YAML stage graph to serve (default: the model's built-in graph; "
            "docs/stage_graphs.md)",
        )
        omni.add_argument(
            "--stage-backend",
            choices=("local", "ray"),
            default=None,
            help="where every stage computes: local processes, or Ray (each stage in an actor: "
            "a DiT stage's loop, an AR stage's whole vLLM engine; docs/distributed.md). "
            "Default: the stage graph's own setting (local)",
        )
        omni.add_argument(
            "--dit-cache",
            default=None,
            metavar="THRESHOLD|JSON",
            help="first-block residual caching in the graph's DiT stages: a threshold (e.g. "
            "0.2) or a JSON object of ResidualCacheConfig fields (threshold, warmup_steps, "
            "final_steps, max_consecutive). Off by default; requests may still set "
            "cache_threshold (docs/dit_acceleration.md)",
        )
        omni.add_argument(
            "--dit-scheduling-policy",
            choices=("fcfs", "deadline"),
            default=None,
            help="how DiT stages pick requests at each denoising step: fcfs (arrival order, all "
            "running requests advance) or deadline (least slack first by each request's "
            "latency_slo_ms: the most urgent request and others of its size advance, other sizes "
            "as far as the requests still on time can spare the time; starvation guard)",
        )
        omni.add_argument(
            "--dit-admission-control",
            action="store_true",
            help="with --dit-scheduling-policy deadline: refuse (HTTP 429) a request whose "
            "latency_slo_ms cannot be met given the work queued ahead of it",
        )
        omni.add_argument(
            "--max-image-pixels",
            type=int,
            default=DEFAULT_MAX_PIXELS,
            help="largest width x height an image request may ask for",
        )
        omni.add_argument(
            "--max-request-steps",
            type=int,
            default=DEFAULT_MAX_REQUEST_STEPS,
            help="largest n x num_inference_steps of one image request (with "
            "--max-image-pixels, a bound on the work one request holds the DiT stage with)",
        )
        videos = parser.add_argument_group("omni video jobs (/v1/videos)")
        videos.add_argument(
            "--max-video-frames",
            type=int,
            default=DEFAULT_MAX_VIDEO_FRAMES,
            help="most frames a video job may ask for",
        )
        videos.add_argument(
            "--video-ttl",
            type=float,
            default=DEFAULT_VIDEO_TTL_S,
            help="seconds a finished video job (and its MP4) is kept after it finishes",
        )
        videos.add_argument(
            "--max-video-storage-mb",
            type=int,
            default=DEFAULT_MAX_VIDEO_STORAGE_MB,
            help="disk the finished videos may take; the oldest expire first to make room",
        )
        videos.add_argument(
            "--max-video-jobs",
            type=int,
            default=DEFAULT_MAX_VIDEO_JOBS,
            help="video jobs queued or running at once; more are refused with HTTP 429",
        )
        videos.add_argument(
            "--video-dir",
            default=None,
            help="folder of the finished MP4s and the jobs' records (SQLite), kept across "
            "restarts: a server started again on it serves the videos finished before, within "
            "--video-ttl (default: a temporary folder, removed when the server stops)",
        )
        return parser

    def validate(self, args: argparse.Namespace) -> None:
        try:
            apply_cpp_args(args)
        except ValueError as e:
            raise SystemExit(f"vllm-omni serve: error: {e}") from None
        super().validate(args)

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        if args.stage_configs is not None or is_multi_stage(
            args.model, args.revision, args.download_dir
        ):
            serve_stage_graph(args)
            return
        ServeSubcommand.cmd(args)


def serve_stage_graph(args: argparse.Namespace) -> None:
    from vllm_omni.entrypoints.openai.api_server import run_server

    run_server(server_config(args), args.host, args.port, args.uvicorn_log_level)


def _residual_cache(value: str | None) -> dict | None:
    if value is None:
        return None
    from vllm_omni.diffusion.residual_cache import ResidualCacheConfig

    try:
        return dict(ResidualCacheConfig.parse(value).__dict__)
    except ValueError as e:
        raise SystemExit(f"vllm-omni serve: error: --dit-cache: {e}") from None


def _planned_memory(args: argparse.Namespace, graph) -> dict[str, float]:
    """Each AR stage's gpu_memory_utilization: the user's --gpu-memory-utilization for every
    stage, else on CUDA the memory plan's share (logged); vLLM's default would give every stage
    0.92 of the device that they share."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_omni.engine.memory_plan import plan_for_this_device

    if args.gpu_memory_utilization != EngineArgs.gpu_memory_utilization:
        chosen = args.gpu_memory_utilization
        return {s.name: chosen for s in graph.stages if s.engine_type == "AR"}
    plan = plan_for_this_device(args.model, graph, args.dtype, args.max_model_len)
    if plan is None:
        return {}
    return {s.name: s.gpu_memory_utilization for s in plan.stages if s.engine_type == "AR"}


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """--api-key, else VLLM_API_KEY, as vLLM's own server reads them."""
    import vllm.envs as envs

    return tuple(key for key in (args.api_key or [envs.VLLM_API_KEY]) if key)


def server_config(args: argparse.Namespace):
    """The omni server's config from vLLM-style serve args; vLLM flags that make sense for
    the graph's AR stages are passed on to them as stage overrides."""
    from vllm_omni.config.model_defaults import resolve_stage_graph
    from vllm_omni.entrypoints.openai.api_server import ServerConfig
    from vllm_omni.registry import executor_kind

    try:
        graph = resolve_stage_graph(
            args.model, args.stage_configs, revision=args.revision, download_dir=args.download_dir
        )
    except ValueError as e:
        raise SystemExit(f"vllm-omni serve: error: {e}") from None
    overrides = {}
    memory = _planned_memory(args, graph)
    residual_cache = _residual_cache(args.dit_cache)
    for stage in graph.stages:
        if args.stage_backend is not None:
            overrides[stage.name] = {"backend": args.stage_backend}
        if stage.engine_type == "DiT" and executor_kind(stage.executor).residual_cache:
            dit = {}
            if residual_cache is not None:
                dit["residual_cache"] = residual_cache
            if args.dit_scheduling_policy is not None:
                dit["scheduling_policy"] = args.dit_scheduling_policy
            if args.dit_admission_control:
                dit["admission_control"] = True
            if dit:
                overrides.setdefault(stage.name, {})["dit"] = dit
        if stage.engine_type != "AR":
            continue
        engine_args: dict = {}
        override: dict = {**overrides.get(stage.name, {}), "engine_args": engine_args}
        if stage.name in memory and "gpu_memory_utilization" not in stage.engine_args:
            engine_args["gpu_memory_utilization"] = memory[stage.name]
        if args.enforce_eager:
            engine_args["enforce_eager"] = True
        if getattr(args, "dtype", "auto") != "auto":
            engine_args["dtype"] = args.dtype
        if getattr(args, "max_model_len", None) is not None:
            engine_args["max_model_len"] = args.max_model_len
        if args.pipeline_parallel_size > 1:
            engine_args["pipeline_parallel_size"] = args.pipeline_parallel_size
        if args.cpp:
            override["scheduler"] = "cpp"
            engine_args["cpp"] = (args.additional_config or {}).get(CPP_CONFIG_KEY)
        overrides[stage.name] = override
    return ServerConfig(
        model=args.model,
        graph=graph.with_overrides(overrides),
        served_model_name=(args.served_model_name or [args.model])[0],
        api_keys=_api_keys(args),
        max_pixels=args.max_image_pixels,
        max_request_steps=args.max_request_steps,
        max_video_frames=args.max_video_frames,
        video_ttl_s=args.video_ttl,
        max_video_storage_mb=args.max_video_storage_mb,
        max_video_jobs=args.max_video_jobs,
        video_dir=args.video_dir,
        shutdown_timeout=args.shutdown_timeout,
        stage_configs=args.stage_configs,
        stage_overrides=overrides,
        revision=args.revision,
        download_dir=args.download_dir,
    )
