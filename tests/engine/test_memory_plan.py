# SPDX-License-Identifier: Apache-2.0
"""The memory plan at real sizes, on meta tensors: parameter counts equal the whole model's
modules, KV bytes as vLLM counts them, placements that fit and errors that name the stage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from vllm_omni.config.model_defaults import resolve_stage_graph
from vllm_omni.engine.memory_plan import (
    DEVICE_BUDGET,
    PROCESS_OVERHEAD_BYTES,
    GiB,
    parse_bytes,
    plan_memory,
)
from vllm_omni.meta_modules import on_meta

from ..helpers.server import BIN

QWEN25_VL_7B_TEXT = dict(
    hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
    intermediate_size=18944, vocab_size=152064, max_position_embeddings=128000,
)  # fmt: skip
QWEN25_VL_7B_VISION = dict(
    depth=32, hidden_size=1280, out_hidden_size=3584, intermediate_size=3420, num_heads=16
)


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def omni_folder(tmp_path_factory) -> Path:
    """Qwen2.5-Omni at the sizes of transformers' config defaults (an 18B model), config only."""
    from transformers import Qwen2_5OmniConfig

    folder = tmp_path_factory.mktemp("qwen25-omni-real")
    Qwen2_5OmniConfig().to_json_file(folder / "config.json")
    return folder


@pytest.fixture(scope="module")
def qwen_image_folder(tiny_models, tmp_path_factory) -> Path:
    """Qwen-Image's pipeline at the release's sizes: diffusers' defaults of the 20B transformer
    and the VAE, and Qwen2.5-VL-7B's shape for the text encoder; config files only."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig

    tiny = tiny_models["qwen-image"]
    folder = tmp_path_factory.mktemp("qwen-image-real")
    shutil.copy(tiny / "model_index.json", folder)
    shutil.copytree(tiny / "scheduler", folder / "scheduler")
    shutil.copytree(tiny / "tokenizer", folder / "tokenizer")
    for name, cls in (
        ("transformer", QwenImageTransformer2DModel),
        ("vae", AutoencoderKLQwenImage),
    ):
        on_meta(cls).save_config(folder / name)  # the class's defaults
    (folder / "text_encoder").mkdir()
    Qwen2_5_VLConfig(
        text_config=QWEN25_VL_7B_TEXT,
        vision_config=QWEN25_VL_7B_VISION,
        architectures=["Qwen2_5_VLForConditionalGeneration"],
    ).to_json_file(folder / "text_encoder" / "config.json")
    return folder


def test_omni_plan_counts_the_whole_models_parameters(omni_folder: Path) -> None:
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    plan = plan_memory("omni", resolve_stage_graph(omni_folder))
    whole = on_meta(lambda: Qwen2_5OmniForConditionalGeneration(Qwen2_5OmniConfig()))
    stages = {s.name: s for s in plan.stages}
    assert stages["thinker"].params == _params(whole.thinker)
    assert stages["talker"].params == _params(whole.talker)
    assert stages["code2wav"].params == _params(whole.token2wav)
    assert sum(s.params for s in plan.stages) == _params(whole)
    for s in plan.stages:
        assert s.weight_bytes == 2 * s.params  # bfloat16

    # KV as vLLM counts it: layers x (key + value) x KV heads x head size x 2 bytes, per token,
    # for one sequence of the model's context in whole 16-token blocks.
    text = Qwen2_5OmniConfig().thinker_config.text_config
    per_token = text.num_hidden_layers * 2 * text.num_key_value_heads * 128 * 2
    assert text.hidden_size // text.num_attention_heads == 128
    assert stages["thinker"].kv_bytes == per_token * 32768 == 57344 * 32768
    assert stages["code2wav"].kv_bytes == 0 and stages["code2wav"].gpu_memory_utilization is None


def test_omni_plan_on_one_80gib_device(omni_folder: Path, tmp_path: Path) -> None:
    plan = plan_memory("omni", resolve_stage_graph(omni_folder), device_memory=80 * GiB)
    assert {s.device for s in plan.stages} == {0}
    used = sum(s.total_bytes for s in plan.stages)
    assert used <= DEVICE_BUDGET * 80 * GiB
    # AR stages get their need plus the memory left over; the device is not over-committed.
    shares = sum(s.gpu_memory_utilization or 0 for s in plan.stages)
    dit = sum(s.total_bytes for s in plan.stages if s.engine_type == "DiT") / (80 * GiB)
    overhead = PROCESS_OVERHEAD_BYTES * 2 / (80 * GiB)
    assert DEVICE_BUDGET - 0.01 <= shares + dit + overhead <= DEVICE_BUDGET
    for s in plan.stages:
        if s.engine_type == "AR":
            assert s.gpu_memory_utilization * 80 * GiB >= s.total_bytes - PROCESS_OVERHEAD_BYTES
    plan.write_json(tmp_path / "plan.json")
    saved = json.loads((tmp_path / "plan.json").read_text())
    for stage in saved["stages"]:
        assert {"name", "params", "weight_bytes", "kv_bytes", "device"} <= set(stage)


def test_what_does_not_fit_is_named(omni_folder: Path) -> None:
    graph = resolve_stage_graph(omni_folder)
    with pytest.raises(ValueError, match=r"stage 'thinker' does not fit: .* short by \d"):
        plan_memory("omni", graph, device_memory=24 * GiB)
    # Two 24 GiB devices still cannot hold the 11B thinker in bfloat16 with its context ...
    with pytest.raises(ValueError, match="stage 'thinker'"):
        plan_memory("omni", graph, device_memory=24 * GiB, num_devices=2)
    # ... two 32 GiB devices with a shorter context do, the thinker on one of its own.
    plan = plan_memory("omni", graph, device_memory=32 * GiB, num_devices=2, max_model_len=4096)
    devices = {s.name: s.device for s in plan.stages}
    assert devices["thinker"] != devices["talker"] == devices["code2wav"]
    for device in (0, 1):
        on_it = [s for s in plan.stages if s.device == device]
        assert sum(s.total_bytes for s in on_it) <= DEVICE_BUDGET * 32 * GiB


def test_qwen_image_plan(qwen_image_folder: Path) -> None:
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    plan = plan_memory("qwen-image", resolve_stage_graph(qwen_image_folder))
    stages = {s.name: s for s in plan.stages}
    transformer = on_meta(QwenImageTransformer2DModel)
    vae = on_meta(AutoencoderKLQwenImage)
    assert stages["dit"].params == _params(transformer) + _params(vae)
    assert 20e9 < stages["dit"].params < 21e9  # the 20B release
    config = Qwen2_5_VLConfig(text_config=QWEN25_VL_7B_TEXT, vision_config=QWEN25_VL_7B_VISION)
    encoder = on_meta(lambda: Qwen2_5_VLForConditionalGeneration(config))
    assert stages["text_encoder"].params == _params(encoder)
    # A pooling encoder keeps one input's KV: its stage's own context, not the model's 128K.
    length = stages["text_encoder"].max_model_len
    assert length < 2048
    assert stages["text_encoder"].kv_bytes == 28 * 2 * 4 * 128 * 2 * (-(-length // 16) * 16)
    with pytest.raises(ValueError, match="stage 'dit' does not fit"):
        plan_memory("qwen-image", resolve_stage_graph(qwen_image_folder), device_memory=40 * GiB)


def test_sizes_parse() -> None:
    assert parse_bytes("80GiB") == 80 * GiB and parse_bytes("24GB") == 24 * 10**9
    assert parse_bytes("512MiB") == 2**29 and parse_bytes("1000") == 1000
    for bad in ("lots", "-1GiB", "80XB"):
        with pytest.raises(ValueError, match="device_memory"):
            parse_bytes(bad)


def test_plan_command(hub_env, omni_folder: Path, tmp_path: Path) -> None:
    """`vllm-omni plan` by repo id (config files only, offline), and a one-line error."""
    env = {**os.environ, **hub_env}
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [str(BIN / "vllm-omni"), "plan", "Qwen/Qwen-Image", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "text_encoder" in done.stdout and "dit" in done.stdout
    assert [s["name"] for s in json.loads(out.read_text())["stages"]] == ["text_encoder", "dit"]
    done = subprocess.run(
        [str(BIN / "vllm-omni"), "plan", str(omni_folder), "--device-memory", "24GiB"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1
    assert "error: stage 'thinker' does not fit" in done.stderr
    assert "Traceback" not in done.stderr
