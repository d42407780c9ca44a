# SPDX-License-Identifier: Apache-2.0
"""OmniEngine.prepare without engines: request options reach the stages that declare them, a
stage's executor kind fills in and checks its parameters, errors name the field."""

from __future__ import annotations

import pytest

from vllm_omni.config.model_defaults import resolve_stage_graph
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.engine.omni_engine import OmniEngine
from vllm_omni.models.qwen2_5_omni.code2wav import SAMPLE_RATE, Code2WavInfo
from vllm_omni.models.qwen2_5_omni.params import Code2WavParams
from vllm_omni.models.qwen2_5_omni.tiny import SPEAKERS


@pytest.fixture(scope="module")
def omni_engine(tiny_models) -> OmniEngine:
    """Qwen2.5-Omni's graph, its stages built but not started (the code2wav stage's info as its
    process would report it)."""
    engine = OmniEngine(resolve_stage_graph(str(tiny_models["qwen2.5-omni"])))
    info = Code2WavInfo(SAMPLE_RATE, tuple(sorted(SPEAKERS)), 480, 4096, 12)
    engine.stages["code2wav"].info = info
    return engine


@pytest.fixture(scope="module")
def image_engine(tiny_models) -> OmniEngine:
    engine = OmniEngine(resolve_stage_graph(str(tiny_models["qwen-image"])))
    engine.stages["dit"].info = ImageStageInfo(default_size=(128, 128), size_multiple=16)
    return engine


def test_a_voice_reaches_the_stages_that_take_it(omni_engine: OmniEngine) -> None:
    voice = sorted(SPEAKERS)[-1]
    inputs, params = omni_engine.prepare({"prompt": "hi", "voice": voice})
    assert list(params) == ["thinker", "talker", "code2wav"]
    assert params["code2wav"].voice == voice
    assert params["code2wav"].seed is not None  # filled in, so the audio can be reproduced
    assert "voice" in omni_engine.request_options


def test_options_are_checked_by_the_stage_that_reads_them(omni_engine: OmniEngine) -> None:
    with pytest.raises(ValueError, match=r"^voice: unknown voice 'Nobody'"):
        omni_engine.prepare({"prompt": "hi", "voice": "Nobody"})
    with pytest.raises(ValueError, match=r"^voice: no stage of this request takes it"):
        omni_engine.prepare({"prompt": "hi", "voice": sorted(SPEAKERS)[0], "modalities": ["text"]})
    with pytest.raises(ValueError, match=r"^voice: unknown voice 7"):
        omni_engine.prepare({"prompt": "hi", "voice": 7})
    with pytest.raises(ValueError, match=r"^prompt\.colour: unknown field"):
        omni_engine.prepare({"prompt": "hi", "colour": "red"})


def test_one_params_object_goes_to_the_stages_of_its_type(omni_engine: OmniEngine) -> None:
    _, params = omni_engine.prepare("hi", Code2WavParams(seed=7))
    assert params["code2wav"].seed == 7
    with pytest.raises(ValueError, match="sampling_params: no stage takes DiffusionSamplingParams"):
        omni_engine.prepare("hi", DiffusionSamplingParams())


def test_an_image_stage_fills_in_size_and_asks_for_the_negative_prompt(
    image_engine: OmniEngine,
) -> None:
    inputs, params = image_engine.prepare(
        "a cat", DiffusionSamplingParams(negative_prompt="blurry", true_cfg_scale=4.0)
    )
    assert (params["dit"].height, params["dit"].width) == (128, 128)
    assert inputs["negative_prompt"] == "blurry"  # the text encoder must encode it
    with pytest.raises(ValueError, match=r"^height: must be a multiple of 16, got 100"):
        image_engine.prepare("a cat", DiffusionSamplingParams(height=100))
    with pytest.raises(ValueError, match="messages: this model takes a text prompt"):
        image_engine.prepare({"messages": [{"role": "user", "content": "hi"}]})
