# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni: MoE thinker (text) -> MoE talker + code predictor (speech codes) -> code2wav."""

from vllm_omni.models.qwen3_omni.code2wav import Qwen3Code2WavKind
from vllm_omni.models.qwen3_omni.graph import stage_graph
from vllm_omni.models.qwen3_omni.tiny import build_qwen3_omni
from vllm_omni.registry import ModelFamily, TinyModel


def _thinker(config):
    from vllm_omni.models.qwen3_omni.thinker import Qwen3ThinkerGenerator

    return Qwen3ThinkerGenerator()


def _talker(config):
    from vllm_omni.models.qwen3_omni.talker import Qwen3TalkerGenerator

    return Qwen3TalkerGenerator.for_stage(config)


def _pinned() -> list:
    from vllm_omni.models.qwen3_omni.pinned import pinned

    return pinned()


def _seeded_params(seed: int, voice: str, stages: list[str]) -> dict:
    """A seeded speaking request: the talker (its sampling defaults, the code predictor's draws
    included) seeded too; code2wav draws nothing."""
    from vllm import SamplingParams

    from vllm_omni.models.qwen3_omni.talker import TALKER_MAX_TOKENS, TALKER_SAMPLING

    if "talker" not in stages:
        return {}
    return {"talker": SamplingParams(max_tokens=TALKER_MAX_TOKENS, seed=seed, **TALKER_SAMPLING)}


def _speech_api(app, server) -> None:
    from vllm_omni.models.omni_speech import chat, speech

    family = chat.SpeechFamily(
        seeded_params=_seeded_params,
        speech_prompt=speech.chatml_speech_prompt,
        speech_params=speech.speak_given_text,
    )
    chat.add_routes(app, server, family)
    speech.add_routes(app, server, family)


def _thinker_hook() -> type:
    from vllm_omni.models.qwen3_omni.thinker import AcceptLayerHook

    return AcceptLayerHook


def _talker_hook() -> type:
    from vllm_omni.models.qwen3_omni.talker_worker import TalkerStepHook

    return TalkerStepHook


FAMILY = ModelFamily(
    name="qwen3_omni",
    graph=stage_graph,
    model_types=("qwen3_omni_moe",),
    split_stages={
        "thinker": ("Qwen3OmniMoeThinkerForConditionalGeneration", "thinker_config"),
        "talker": ("Qwen3OmniMoeTalkerForConditionalGeneration", "talker_config"),
        "code2wav": ("Qwen3OmniMoeCode2Wav", "code2wav_config"),
    },
    repos=(
        "Qwen/Qwen3-Omni-30B-A3B-Instruct",
        "Qwen/Qwen3-Omni-30B-A3B-Thinking",
        "Qwen/Qwen3-Omni-30B-A3B-Captioner",
    ),
    words=("qwen", "thinker", "talker", "code2wav", "voice"),
    processors={"qwen3_omni_thinker": _thinker, "qwen3_omni_talker": _talker},
    executors=(Qwen3Code2WavKind(),),
    worker_hooks={"qwen3_omni_thinker": _thinker_hook, "qwen3_omni_talker": _talker_hook},
    vllm_models={
        "Qwen3OmniTalkerForCodec": (
            "vllm_omni.models.qwen3_omni.talker_model:Qwen3OmniTalkerForCodec"
        )
    },
    api=_speech_api,
    pinned=_pinned,
    tiny_models={
        "qwen3-omni": TinyModel(build_qwen3_omni, ("Qwen/Qwen3-Omni-30B-A3B-Instruct",)),
    },
)
