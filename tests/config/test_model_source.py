# SPDX-License-Identifier: Apache-2.0
"""Models by the names users type: hub repo ids found in a Hugging Face cache (the tiny models
stored under the real names, offline), what is fetched online, and the errors."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx2
import huggingface_hub
import pytest

from vllm_omni.config.model_defaults import inspect_model, resolve_stage_graph
from vllm_omni.config.model_source import diffusers_patterns, fetch_model, is_repo_id
from vllm_omni.config.stage_config import StageGraph
from vllm_omni.testing.tiny_hub import repo_folder, store_snapshot

from ..helpers.hub import offline_hub_at
from ..helpers.server import BIN


def test_repo_ids_are_told_from_paths() -> None:
    assert is_repo_id("Qwen/Qwen-Image") and is_repo_id("gpt2")
    assert not any(map(is_repo_id, ("/abs/path", "./rel", "~/m", "a/b/c", "bad id!!")))


def test_hub_ids_resolve_from_the_cache(offline_hub: Path) -> None:
    assert inspect_model("Qwen/Qwen-Image") == "qwen_image"
    assert inspect_model("Qwen/Qwen2.5-Omni-7B") == "qwen2_5_omni"
    assert inspect_model("Qwen/Qwen2.5-0.5B-Instruct") == "lm"

    graph = resolve_stage_graph("Qwen/Qwen-Image")
    snapshot = next((repo_folder(offline_hub, "Qwen/Qwen-Image") / "snapshots").iterdir())
    assert graph["dit"].model == str(snapshot)
    assert graph["text_encoder"].model == str(snapshot / "text_encoder")
    assert graph["text_encoder"].tokenizer == str(snapshot / "tokenizer")
    edit = resolve_stage_graph("Qwen/Qwen-Image-Edit-2509")
    snapshot = next((repo_folder(offline_hub, "Qwen/Qwen-Image-Edit-2509") / "snapshots").iterdir())
    assert edit.model_type == "qwen_image_edit_plus"
    assert edit["text_encoder"].hf_processor == str(snapshot / "processor")
    omni = resolve_stage_graph("Qwen/Qwen2.5-Omni-3B")
    assert [s.name for s in omni.stages] == ["thinker", "talker", "code2wav"]
    assert Path(omni["talker"].model, "spk_dict.pt").is_file()


def test_stage_graph_yaml_names_hub_models(offline_hub: Path, tmp_path: Path) -> None:
    """A stage's `model:` may be a hub id; relative paths still start at the YAML's folder."""
    (tmp_path / "local").mkdir()
    values = {
        "stages": [
            {"name": "a", "engine_type": "AR", "model": "Qwen/Qwen2.5-0.5B-Instruct"},
            {"name": "b", "engine_type": "AR", "model": "local", "final_output": True},
        ]
    }
    path = tmp_path / "graph.yaml"
    path.write_text(json.dumps(values))
    graph = resolve_stage_graph(stage_configs=path)
    assert Path(graph["a"].model, "config.json").is_file()
    assert graph["a"].model.startswith(str(offline_hub))
    assert graph["b"].model == str(tmp_path / "local")
    values["stages"][0]["model"] = "Qwen/Not-Cached"
    with pytest.raises(ValueError, match=r"stages\[0\]\.model: .*'Qwen/Not-Cached'.*not in the"):
        StageGraph.from_dict(values, tmp_path)


def test_download_dir_is_the_cache(hub_cache: Path, tmp_path: Path) -> None:
    """`download_dir` (vLLM's --download-dir) wins over HF_HUB_CACHE."""
    with offline_hub_at(tmp_path / "empty"):
        with pytest.raises(ValueError, match="not in the Hugging Face cache"):
            inspect_model("Qwen/Qwen-Image")
        assert inspect_model("Qwen/Qwen-Image", download_dir=hub_cache) == "qwen_image"


def test_clear_errors_name_the_model_and_cause(offline_hub: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'Qwen/Unknown'.*not in the .* HF_HUB_OFFLINE is set"):
        inspect_model("Qwen/Unknown")
    with pytest.raises(ValueError, match=r"'Qwen/Qwen-Image' at revision 'v9'"):
        inspect_model("Qwen/Qwen-Image", revision="v9")
    with pytest.raises(ValueError, match="neither a local folder nor a Hugging Face repo id"):
        inspect_model("not a model!")
    readme_only = tmp_path / "readme-only"
    readme_only.mkdir()
    (readme_only / "README.md").write_text("# a dataset card\n")
    store_snapshot(offline_hub, "someone/not-a-model", readme_only)
    with pytest.raises(ValueError, match=r"'someone/not-a-model' has neither .*found: \['README"):
        resolve_stage_graph("someone/not-a-model")


def test_online_errors(monkeypatch) -> None:
    """What the hub answers online (gated, missing, unknown revision) becomes a ValueError
    that names the model and says what to do."""
    from huggingface_hub import errors

    request = httpx2.Request("GET", "https://huggingface.co/api/models/Qwen/Qwen-Image")
    cases = {
        errors.GatedRepoError: "the repo is gated; accept its terms .* HF_TOKEN",
        errors.RepositoryNotFoundError: "no such repo on .* HF_TOKEN",
        errors.RevisionNotFoundError: "the revision does not exist",
    }
    for error, message in cases.items():

        def fail(*args, error=error, **kwargs):
            raise error("hub says no", response=httpx2.Response(403, request=request))

        monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
        with pytest.raises(ValueError, match=f"model: 'Qwen/Qwen-Image': {message}"):
            inspect_model("Qwen/Qwen-Image")


def test_only_the_graphs_files_are_fetched(hub_cache: Path, monkeypatch) -> None:
    """Online, a repo is fetched in two steps: its config files, then the files its stage
    graph loads (a diffusers pipeline's component folders; a family's extra files)."""
    calls: list[tuple[str, list[str]]] = []
    real = huggingface_hub.snapshot_download

    def recording(repo_id, **kwargs):
        calls.append((repo_id, kwargs["allow_patterns"]))
        return real(repo_id, **{**kwargs, "cache_dir": str(hub_cache), "local_files_only": True})

    monkeypatch.setattr(huggingface_hub, "snapshot_download", recording)
    fetch_model("Qwen/Qwen-Image")
    snapshot = next((repo_folder(hub_cache, "Qwen/Qwen-Image") / "snapshots").iterdir())
    index = json.loads((snapshot / "model_index.json").read_text())
    assert calls == [
        ("Qwen/Qwen-Image", ["model_index.json", "config.json"]),
        ("Qwen/Qwen-Image", diffusers_patterns(index)),
    ]
    assert set(calls[1][1]) == {
        "model_index.json", "scheduler/*", "text_encoder/*", "tokenizer/*", "transformer/*",
        "vae/*",
    }  # fmt: skip
    calls.clear()
    resolve_stage_graph("Qwen/Qwen2.5-Omni-7B")
    assert "spk_dict.pt" in calls[-1][1] and "*.safetensors" in calls[-1][1]


def test_serve_names_an_unknown_hub_model(hub_env) -> None:
    """`vllm serve ORG/NAME --omni` with a repo that is not cached, offline: one line naming
    the model and the cause, before anything starts."""
    done = subprocess.run(
        [str(BIN / "vllm"), "serve", "Qwen/Not-Cached", "--omni"],
        env={**os.environ, **hub_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "error: model: 'Qwen/Not-Cached': not in the Hugging Face cache" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
