# SPDX-License-Identifier: Apache-2.0
"""The model-family registry: detection, built-in graphs, lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_omni.config.stage_config import StageGraph
from vllm_omni.registry import (
    ANY_PIPELINE,
    PLAIN_LM,
    ModelFamily,
    detect_family,
    families,
    get_family,
)


def test_every_family_has_a_valid_graph_of_its_own_name() -> None:
    assert set(families()) == {
        "qwen_image",
        "qwen_image_edit",
        "qwen_image_edit_plus",
        "z_image",
        "wan",
        "aura_flow",
        "qwen2_5_omni",
        "qwen3_omni",
        PLAIN_LM,
        ANY_PIPELINE,
        "diffusers_video_pipeline",
        "diffusers_audio_pipeline",
    }
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
    qwen3 = checkpoint({"config.json": {"model_type": "qwen3_omni_moe"}})
    assert detect_family(qwen3).name == "qwen3_omni"
    assert detect_family(checkpoint({"config.json": {"model_type": "llama"}})).name == PLAIN_LM
    flux = checkpoint({"model_index.json": {"_class_name": "FluxPipeline"}})
    assert detect_family(flux).name == ANY_PIPELINE  # text-to-image: its own call, step-batched
    inpaint = checkpoint({"model_index.json": {"_class_name": "StableDiffusionInpaintPipeline"}})
    with pytest.raises(
        ValueError,
        match=r"'my/inpaint' is a diffusers pipeline of class 'StableDiffusionInpaintPipeline', "
        r"which takes 'mask_image': only text-to-image and image-editing pipelines are served, "
        r"and makes no video \(its __call__ takes no 'num_frames'\), and makes no audio clip "
        r"\(its __call__ takes none of \['audio_end_in_s', 'audio_length_in_s'\]\); no built-in",
    ):
        detect_family(inpaint, "my/inpaint")
    img2img = checkpoint({"model_index.json": {"_class_name": "StableDiffusionImg2ImgPipeline"}})
    with pytest.raises(ValueError, match=r"its __call__ takes no \['height', 'width'\]"):
        detect_family(img2img)
    aura = checkpoint({"model_index.json": {"_class_name": "AuraFlowPipeline"}})
    assert detect_family(aura).name == "aura_flow"  # a family of its own: step-batched
    for pipeline in ("WanPipeline", "WanImageToVideoPipeline"):
        wan = checkpoint({"model_index.json": {"_class_name": pipeline}})
        assert detect_family(wan) is get_family("wan")
    video = checkpoint({"model_index.json": {"_class_name": "CogVideoXPipeline"}})
    assert detect_family(video).name == "diffusers_video_pipeline"  # text-to-video: its own call
    sound = checkpoint({"model_index.json": {"_class_name": "StableAudioPipeline"}})
    assert detect_family(sound).name == "diffusers_audio_pipeline"  # text-to-audio: its own call
    i2v = checkpoint({"model_index.json": {"_class_name": "CogVideoXImageToVideoPipeline"}})
    with pytest.raises(
        ValueError, match=r"takes 'image': only text-to-video pipelines are served as video"
    ):
        detect_family(i2v)
    odd = checkpoint({"model_index.json": {"_class_name": "AutoencoderKL"}})
    with pytest.raises(ValueError, match=r"'AutoencoderKL', which is not a pipeline class"):
        detect_family(odd)
    with pytest.raises(ValueError, match=r"model_type: unknown family 'cogvideox'"):
        get_family("cogvideox")


def test_a_family_is_validated() -> None:
    with pytest.raises(ValueError, match="name: must be an identifier"):
        ModelFamily(name="qwen-image", graph=dict)


def test_importing_the_registry_imports_no_family() -> None:
    code = (
        "import sys, vllm_omni.registry, vllm_omni.config.model_defaults;"
        "print([m for m in sys.modules"
        " if m.startswith('vllm_omni.models.') and not m.endswith('registry')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_registered_name_a_graph_uses_is_a_family_s() -> None:
    """Built-in graphs name processors and executors that the families register, each once."""
    from vllm_omni.registry import executor_kinds, processors

    assert set(processors()) == {
        "qwen_image_prompt",
        "qwen_image_edit_prompt",
        "qwen_image_edit_plus_prompt",
        "z_image_prompt",
        "qwen25_omni_thinker",
        "qwen25_omni_talker",
        "qwen3_omni_thinker",
        "qwen3_omni_talker",
    }
    assert set(executor_kinds()) == {
        "qwen_image",
        "vae_decoder",
        "code2wav",
        "qwen3_code2wav",
        "diffusers_pipeline",
        "diffusers_video_pipeline",
        "diffusers_audio_pipeline",
        "qwen_image_edit",
        "z_image",
        "wan",
        "aura_flow",
    }
    for family in families().values():
        for stage in family.graph()["stages"]:
            if "processor" in stage:
                assert stage["processor"] in processors()
            if stage["engine_type"] == "DiT":
                assert stage["executor"] in executor_kinds()


def test_a_name_registered_twice_is_an_error() -> None:
    from vllm_omni.registry import _by_name

    with pytest.raises(ValueError, match="executor 'x' is registered by two families"):
        _by_name("executor", [("x", 1), ("x", 2)])


def test_an_unknown_executor_names_the_field() -> None:
    from vllm_omni.config.stage_config import StageConfig

    with pytest.raises(ValueError, match=r"executor: DiT stages take one of .*'code2wav'"):
        StageConfig(name="s", engine_type="DiT", model="m", executor="nope")
    with pytest.raises(ValueError, match="residual caching runs in an executor that supports"):
        StageConfig(
            name="s",
            engine_type="DiT",
            model="m",
            executor="code2wav",
            dit={"residual_cache": {"threshold": 0.1}},
        )


def test_a_family_s_vllm_models_are_what_its_modules_define() -> None:
    """The registry holds "module:Class" strings (vLLM imports them lazily): they must exist."""
    import importlib

    for family in families().values():
        for architecture, where in family.vllm_models.items():
            module, cls = where.split(":")
            model = getattr(importlib.import_module(module), cls)
            assert model.__name__ == cls
    from vllm_omni.models.qwen2_5_omni.talker_model import TALKER_ARCH

    assert TALKER_ARCH in families()["qwen2_5_omni"].vllm_models
