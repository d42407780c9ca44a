# SPDX-License-Identifier: Apache-2.0
"""Stage graphs: YAML loading, validation errors that name the field, built-in defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_omni.config.model_defaults import detect_model_type, resolve_stage_graph
from vllm_omni.config.stage_config import StageGraph

YAML = """
model_type: custom
stages:
  - name: enc
    engine_type: AR
    model: text_encoder
    processor: qwen_image_prompt
  - name: dit
    engine_type: DiT
    model: .
    executor: qwen_image
    inputs: {prompt_embeds: enc.prompt_embeds}
    scheduler: fifo
    dit: {max_num_seqs: 4, num_threads: 1}
    final_output: true
"""


def _graph(stages: list[dict]) -> StageGraph:
    return StageGraph.from_dict({"stages": stages})


def _ar(name: str, **kw) -> dict:
    return {"name": name, "engine_type": "AR", "model": "/m", **kw}


def _dit(name: str, **kw) -> dict:
    return {"name": name, "engine_type": "DiT", "model": "/m", "executor": "z_image", **kw}


def test_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text(YAML)
    graph = StageGraph.from_yaml(path, base_dir="/models/qi")
    assert graph.model_type == "custom"
    assert [s.name for s in graph.topological_order()] == ["enc", "dit"]
    enc, dit = graph["enc"], graph["dit"]
    assert enc.model == "/models/qi/text_encoder" and enc.scheduler == "default"
    assert dit.scheduler == "fifo" and dit.executor == "qwen_image"
    assert dit.dit_config().max_num_seqs == 4 and dit.dit_config().model == "/models/qi"
    assert [s.name for s in graph.final_stages] == ["dit"]
    # Relative paths default to the YAML file's folder.
    assert StageGraph.from_yaml(path)["enc"].model == str(tmp_path / "text_encoder")


@pytest.mark.parametrize(
    "stages, message",
    [
        ([{**_ar("a"), "enginetype": "AR"}], r"stages\[0\]\.enginetype: unknown field"),
        ([{"name": "a", "engine_type": "AR"}], r"stages\[0\]\.model: required"),
        ([_ar("a", engine_type="GAN")], r"stages\[0\]\.engine_type: must be one of"),
        ([_ar("a", scheduler="step")], r"stages\[0\]\.scheduler: AR stages take one of"),
        ([_ar("a", processor="nope")], r"stages\[0\]\.processor: must be one of"),
        ([_ar("a", inputs={"x": "nodot"})], r"stages\[0\]\.inputs\.x: must be 'stage.tensor'"),
        ([_ar("a"), _ar("a")], r"stages\[1\]\.name: duplicate stage name 'a'"),
        ([_ar("a", inputs={"x": "b.y"})], r"stages\[0\]\.inputs\.x: unknown stage 'b'"),
        ([_ar("a", inputs={"x": "a.y"})], r"a stage cannot feed itself"),
        ([_ar("a", inputs={"x": "b.y"}), _ar("b", inputs={"y": "a.x"})], r"has a cycle"),
        ([_ar("a", max_inflight=0)], r"stages\[0\]\.max_inflight: must be an integer >= 1"),
        (
            [{**_dit("d"), "dit": {"max_num_seqs": 0}}],
            r"stages\[0\]\.dit\.max_num_seqs: must be an integer >= 1",
        ),
        (
            [{**_dit("d"), "dit": {"steps": 3}}],
            r"stages\[0\]\.dit\.steps: unknown field",
        ),
        ([_ar("a", dit={"max_num_seqs": 2})], r"stages\[0\]\.dit: only DiT stages"),
        (
            [{"name": "d", "engine_type": "DiT", "model": "/m"}],
            r"stages\[0\]\.executor: a process stage names what it runs, one of .*'wan'",
        ),
        ([], r"stages: at least one stage"),
    ],
)
def test_validation_names_the_field(stages: list[dict], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _graph(stages)


def test_dag_fan_out_and_fan_in() -> None:
    graph = _graph(
        [
            _ar("join", inputs={"a": "left.x", "b": "right.y"}),
            _ar("left", inputs={"p": "root.h"}),
            _ar("right", inputs={"p": "root.h"}),
            _ar("root"),
        ]
    )
    order = [s.name for s in graph.topological_order()]
    assert order[0] == "root" and order[-1] == "join"
    assert graph["join"].sources == ["left", "right"]
    assert [s.name for s in graph.final_stages] == ["join"]


def test_bad_yaml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("stages: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        StageGraph.from_yaml(path)
    path.write_text("- just a list\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        StageGraph.from_yaml(path)


def test_built_in_graphs(tmp_path: Path) -> None:
    qi = tmp_path / "qi"
    qi.mkdir()
    (qi / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    assert detect_model_type(qi) == "qwen_image"
    graph = resolve_stage_graph(qi, stage_overrides={"dit": {"dit": {"max_num_seqs": 3}}})
    assert [s.engine_type for s in graph.topological_order()] == ["AR", "DiT"]
    assert [s.name for s in graph.final_stages] == ["dit"]
    assert graph["text_encoder"].model == str(qi / "text_encoder")
    assert graph["text_encoder"].tokenizer == str(qi / "tokenizer")
    assert graph["dit"].dit_config().max_num_seqs == 3
    with pytest.raises(ValueError, match=r"stage_overrides\.nope: no such stage"):
        resolve_stage_graph(qi, stage_overrides={"nope": {}})

    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "config.json").write_text("{}")
    assert [s.name for s in resolve_stage_graph(lm).stages] == ["lm"]

    other = tmp_path / "other"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "NoSuchPipeline"}))
    with pytest.raises(ValueError, match="class 'NoSuchPipeline', which is not a pipeline class"):
        detect_model_type(other)
    with pytest.raises(
        ValueError,
        match=r"neither model_index.json .* nor config.json .*found: \[.lm., .other., .qi.\]",
    ):
        detect_model_type(tmp_path)
