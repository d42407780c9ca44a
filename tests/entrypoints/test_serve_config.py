# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni serve <pipeline>`: vLLM flags become the omni server's config and stage overrides
(no server is started here)."""

from __future__ import annotations

import json

import pytest
from vllm.utils.argparse_utils import FlexibleArgumentParser

from vllm_omni.config.model_defaults import resolve_stage_graph
from vllm_omni.engine.ar_stage import ARStage
from vllm_omni.engine.ray_ar_stage import RayARStage, make_ar_stage
from vllm_omni.entrypoints.cli.serve import OmniServeCommand, server_config


def _args(*argv: str):
    parser = FlexibleArgumentParser()
    command = OmniServeCommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    args.model = args.model_tag
    command.validate(args)
    return args


def test_cpp_and_engine_flags_reach_the_ar_stages(tmp_path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    args = _args(
        str(tmp_path),
        "--cpp",
        "-pp",
        "2",
        "--enforce-eager",
        "--api-key",
        "k",
        "--served-model-name",
        "qi",
        "--max-image-pixels",
        "65536",
    )
    config = server_config(args)
    assert config.served_model_name == "qi" and config.api_keys == ("k",)
    assert config.max_pixels == 65536
    assert set(config.stage_overrides) == {"text_encoder"}  # the DiT stage takes no vLLM flags
    graph = resolve_stage_graph(config.model, config.stage_configs, config.stage_overrides)
    assert config.graph == graph  # resolved once, overrides applied, by `vllm serve`
    assert graph["text_encoder"].scheduler == "cpp"
    engine_args = ARStage(graph["text_encoder"]).engine_args()
    assert engine_args["scheduler_cls"] == "vllm_omni.cpp.scheduler.CPPScheduler"
    assert engine_args["pipeline_parallel_size"] == 2 and engine_args["enforce_eager"]
    assert engine_args["runner"] == "pooling"  # the processor's settings survive
    assert "cpp" in engine_args["additional_config"]


def test_api_key_from_the_environment_as_vllm_reads_it(tmp_path, monkeypatch) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert server_config(_args(str(tmp_path))).api_keys == ("from-env",)
    flag = _args(str(tmp_path), "--api-key", "from-flag")
    assert server_config(flag).api_keys == ("from-flag",)  # the flag wins, as in vLLM


def test_plain_flags_leave_the_graph_alone(tmp_path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    config = server_config(_args(str(tmp_path)))
    assert config.api_keys == () and config.served_model_name == str(tmp_path)
    graph = resolve_stage_graph(config.model, config.stage_configs, config.stage_overrides)
    assert config.graph == graph  # resolved once, overrides applied, by `vllm serve`
    assert graph["text_encoder"].scheduler == "default"
    assert "scheduler_cls" not in ARStage(graph["text_encoder"]).engine_args()


def test_stage_backend_puts_every_stage_on_ray(tmp_path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    config = server_config(_args(str(tmp_path), "--stage-backend", "ray", "--enforce-eager"))
    graph = resolve_stage_graph(config.model, config.stage_configs, config.stage_overrides)
    assert config.graph == graph  # resolved once, overrides applied, by `vllm serve`
    assert {stage.backend for stage in graph.stages} == {"ray"}
    # The engine runs in the stage's actor, its workers as the actor's processes.
    assert isinstance(make_ar_stage(graph["text_encoder"]), RayARStage)
    engine_args = ARStage(graph["text_encoder"]).engine_args()
    assert "distributed_executor_backend" not in engine_args and engine_args["enforce_eager"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0.3", 0.3), ('{"threshold": 0.1, "max_consecutive": 2}', 0.1)],
)
def test_dit_cache_reaches_the_dit_stage_only(tmp_path, value, expected) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    config = server_config(_args(str(tmp_path), "--dit-cache", value))
    graph = resolve_stage_graph(config.model, config.stage_configs, config.stage_overrides)
    assert config.graph == graph  # resolved once, overrides applied, by `vllm serve`
    assert graph["dit"].dit_config().residual_cache.threshold == expected
    assert "dit" not in config.stage_overrides.get("text_encoder", {})


@pytest.mark.parametrize(
    ("value", "field"),
    [("fast", "expected a threshold"), ("1.5", "threshold"), ('{"warmup": 2}', "warmup")],
)
def test_bad_dit_cache_names_the_setting(tmp_path, value, field) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    with pytest.raises(SystemExit, match=f"--dit-cache: {field}"):
        server_config(_args(str(tmp_path), "--dit-cache", value))


def test_cuda_stages_start_with_the_memory_plans_share(tiny_models, monkeypatch) -> None:
    """On CUDA (faked here: no GPU on this machine), each AR stage gets the memory plan's
    gpu_memory_utilization unless the user set one, which every AR stage gets; without CUDA,
    vLLM's default stays."""
    from types import SimpleNamespace

    import torch

    model = str(tiny_models["qwen-image"])
    assert "gpu_memory_utilization" not in _engine_args(server_config(_args(model)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device = SimpleNamespace(total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: device)
    share = _engine_args(server_config(_args(model)))["gpu_memory_utilization"]
    assert 0 < share <= 0.92
    chosen = _args(model, "--gpu-memory-utilization", "0.5")
    assert _engine_args(server_config(chosen))["gpu_memory_utilization"] == 0.5


def _engine_args(config) -> dict:
    return config.stage_overrides.get("text_encoder", {}).get("engine_args", {})


def test_work_per_image_request_is_bounded() -> None:
    """n x num_inference_steps over --max-request-steps is refused, naming the field the
    request set (n alone takes the default 50 steps)."""
    from vllm_omni.entrypoints.openai.api_server import ServerConfig
    from vllm_omni.entrypoints.openai.image_runs import diffusion_params
    from vllm_omni.entrypoints.openai.protocol import ImageGenerationRequest

    config = ServerConfig(model="m", served_model_name="m", max_request_steps=200)
    four = diffusion_params(ImageGenerationRequest(prompt="x", n=4), None, config)
    assert [p.num_inference_steps for p in four] == [50] * 4
    with pytest.raises(ValueError, match=r"^n: n x num_inference_steps is 5 x 50 = 250; the limit"):
        diffusion_params(ImageGenerationRequest(prompt="x", n=5), None, config)
    body = ImageGenerationRequest(prompt="x", n=9, num_inference_steps=446)
    with pytest.raises(ValueError, match=r"^num_inference_steps: .* 4014; the limit is 200"):
        diffusion_params(body, None, config)


def test_which_server_a_local_folder_goes_to(tmp_path) -> None:
    from vllm_omni.entrypoints.cli.serve import is_multi_stage

    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not is_multi_stage(str(lm))  # vLLM's own server
    sd3 = tmp_path / "sd3"
    sd3.mkdir()
    (sd3 / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    assert is_multi_stage(str(sd3))  # one process stage
    gguf = tmp_path / "gguf"
    gguf.mkdir()
    (gguf / "model.gguf").write_text("")
    assert not is_multi_stage(str(gguf))  # left to vLLM
    edit = tmp_path / "edit"
    edit.mkdir()
    (edit / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusionInpaintPipeline"})
    )
    with pytest.raises(SystemExit, match="'StableDiffusionInpaintPipeline', which takes 'mask_"):
        is_multi_stage(str(edit))
