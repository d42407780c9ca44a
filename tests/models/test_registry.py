# SPDX-License-Identifier: Apache-2.0
"""The model-family registry: detection, built-in graphs, lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni.config.stage_config import StageGraph
from vllm_omni.models.registry import (
    PLAIN_LM,
    ModelFamily,
    detect_family,
    families,
    get_family,
)


def test_every_family_has_a_valid_graph_of_its_own_name() -> None:
    assert set(families()) == {"qwen_image", "qwen2_5_omni", PLAIN_LM}
    for name, family in families().items():
        graph = StageGraph.from_dict(family.graph(), Path("/models/x"))
        assert graph.model_type == name
        assert family.name == name


def test_detection(tmp_path: Path) -> None:
    def checkpoint(files: dict[str, dict]) -> Path:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        for name, content in files.items():
            (folder / name).write_text(json.dumps(content))
        return folder

    image = checkpoint({"model_index.json": {"_class_name": "QwenImagePipeline"}})
    assert detect_family(image) is get_family("qwen_image")
    omni = checkpoint({"config.json": {"model_type": "qwen2_5_omni"}})
    assert detect_family(omni).split_stages["talker"][1] == "talker_config"
    assert detect_family(omni).extra_files == ("spk_dict.pt",)
    assert detect_family(checkpoint({"config.json": {"model_type": "llama"}})).name == PLAIN_LM
    flux = checkpoint({"model_index.json": {"_class_name": "FluxPipeline"}})
    with pytest.raises(ValueError, match=r"'my/flux' is a diffusers pipeline of class 'Flux"):
        detect_family(flux, "my/flux")
    with pytest.raises(ValueError, match=r"model_type: unknown family 'wan'"):
        get_family("wan")


def test_a_family_is_validated() -> None:
    with pytest.raises(ValueError, match="name: must be an identifier"):
        ModelFamily(name="qwen-image", graph=dict)


def test_importing_the_registry_imports_no_family() -> None:
    code = (
        "import sys, vllm_omni.models.registry, vllm_omni.config.model_defaults;"
        "print([m for m in sys.modules"
        " if m.startswith('vllm_omni.models.') and not m.endswith('registry')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
