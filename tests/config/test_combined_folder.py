# SPDX-License-Identifier: Apache-2.0
"""A model and its processor, split across a pipeline's folders, as one folder vLLM loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.config.combined_folder import model_with_processor
from vllm_omni.platform.cache_dir import CACHE_ENV


@pytest.fixture
def split(tmp_path, monkeypatch) -> tuple[Path, Path]:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    model, processor = tmp_path / "text_encoder", tmp_path / "processor"
    model.mkdir()
    processor.mkdir()
    (model / "config.json").write_text('{"from": "model"}')
    (model / "model.safetensors").write_bytes(b"weights")
    (processor / "processor_config.json").write_text("{}")
    (processor / "config.json").write_text('{"from": "processor"}')
    return model, processor


def test_links_both_folders_files_the_model_s_first(split) -> None:
    model, processor = split
    combined = Path(model_with_processor(str(model), str(processor)))
    assert sorted(p.name for p in combined.iterdir()) == [
        "config.json",
        "model.safetensors",
        "processor_config.json",
    ]
    assert (combined / "config.json").read_text() == '{"from": "model"}'
    assert (combined / "model.safetensors").is_symlink()  # no copy of the weights
    assert model_with_processor(str(model), str(processor)) == str(combined)  # reused


def test_a_changed_folder_gets_a_new_combination(split) -> None:
    model, processor = split
    first = model_with_processor(str(model), str(processor))
    (processor / "chat_template.jinja").write_text("{{ x }}")
    second = model_with_processor(str(model), str(processor))
    assert second != first and Path(second, "chat_template.jinja").is_file()


def test_a_missing_folder_names_the_field(split, tmp_path) -> None:
    model, _ = split
    with pytest.raises(ValueError, match="^hf_processor: .* is not a folder"):
        model_with_processor(str(model), str(tmp_path / "nowhere"))
