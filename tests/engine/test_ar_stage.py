# SPDX-License-Identifier: Apache-2.0
"""An AR stage's engine arguments (no engine is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.config.stage_config import StageConfig
from vllm_omni.engine.ar_stage import ARStage


def test_a_model_folder_without_a_tokenizer_needs_one_named(tmp_path) -> None:
    """As in a diffusers pipeline's text_encoder/ (its tokenizer is in tokenizer/): an error
    before the engine starts, not a request that fails later with an empty prompt."""
    (tmp_path / "text_encoder").mkdir()
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer_config.json").write_text("{}")
    stage = StageConfig(name="enc", engine_type="AR", model=str(tmp_path / "text_encoder"))
    with pytest.raises(ValueError, match=r"^stages\.enc\.tokenizer: .* holds no tokenizer"):
        ARStage(stage).engine_args()
    named = StageConfig(
        name="enc",
        engine_type="AR",
        model=str(tmp_path / "text_encoder"),
        tokenizer=str(tmp_path / "tokenizer"),
    )
    assert ARStage(named).engine_args()["tokenizer"] == str(tmp_path / "tokenizer")


def test_an_image_encoder_loads_the_model_with_its_processor(tiny_models, tmp_path, monkeypatch):
    """Qwen-Image-Edit's text encoder stage: vLLM gets one folder with the encoder's files and
    the processor's, the checkpoint's float32 (not vLLM's float16 for it), and room for the
    image."""
    from vllm_omni.config.model_defaults import resolve_stage_graph
    from vllm_omni.platform.cache_dir import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    graph = resolve_stage_graph(str(tiny_models["qwen-image-edit"]))
    args = ARStage(graph["text_encoder"]).engine_args()
    model = Path(args["model"])
    assert model.parent == tmp_path / "combined"
    assert {"config.json", "processor_config.json", "tokenizer.json"} <= {
        p.name for p in model.iterdir()
    }
    assert args["dtype"] == "float32" and args["runner"] == "pooling"
    assert args["limit_mm_per_prompt"] == {"image": 1, "video": 0}
    assert args["max_model_len"] > 64 + 1024 + 1024 * 1024 // (28 * 28)


def test_an_encoder_keeps_a_16_bit_checkpoint_s_dtype_to_vllm(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"text_config": {"dtype": "bfloat16"}}')
    (tmp_path / "tokenizer_config.json").write_text("{}")
    stage = StageConfig(
        name="enc", engine_type="AR", model=str(tmp_path), processor="qwen_image_prompt"
    )
    assert "dtype" not in ARStage(stage).engine_args()  # vLLM's auto (and the CPU's rule)
