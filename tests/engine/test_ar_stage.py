# SPDX-License-Identifier: Apache-2.0
"""An AR stage's engine arguments (no engine is started)."""

from __future__ import annotations

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
