# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-Omni: thinker (text) -> talker (speech codes) -> code2wav (waveform)."""

from vllm_omni.models.qwen2_5_omni.graph import stage_graph
from vllm_omni.models.qwen2_5_omni.kinds import Code2WavKind
from vllm_omni.models.qwen2_5_omni.tiny import build_qwen25_omni
from vllm_omni.registry import ModelFamily, TinyModel


def _thinker(config):
    from vllm_omni.models.omni_thinker import ThinkerGenerator

    return ThinkerGenerator()


def _talker(config):
    from vllm_omni.models.qwen2_5_omni.talker import TalkerGenerator

    return TalkerGenerator.for_stage(config)


def _talker_hook() -> type:
    from vllm_omni.models.qwen2_5_omni.talker_worker import TalkerConditioningHook

    return TalkerConditioningHook


def _pinned() -> list:
    from vllm_omni.models.qwen2_5_omni.pinned import pinned

    return pinned()


def _seeded_params(seed: int, voice: str, stages: list[str]) -> dict:
    """A seeded speaking request: the talker with its sampling defaults and code2wav's noise
    seeded too."""
    from vllm import SamplingParams

    from vllm_omni.models.qwen2_5_omni.params import Code2WavParams
    from vllm_omni.models.qwen2_5_omni.talker import TALKER_MAX_TOKENS, TALKER_SAMPLING

    params: dict = {}
    if "talker" in stages:
        params["talker"] = SamplingParams(
            max_tokens=TALKER_MAX_TOKENS, seed=seed, **TALKER_SAMPLING
        )
    if "code2wav" in stages:
        params["code2wav"] = Code2WavParams(seed=seed, voice=voice)
    return params


def _speech_api(app, server) -> None:
    from vllm_omni.models.omni_speech import chat, speech

    family = chat.SpeechFamily(
        seeded_params=_seeded_params,
        speech_prompt=speech.chatml_speech_prompt,
        speech_params=speech.speak_given_text,
    )
    chat.add_routes(app, server, family)
    speech.add_routes(app, server, family)


FAMILY = ModelFamily(
    name="qwen2_5_omni",
    graph=stage_graph,
    model_types=("qwen2_5_omni",),
    extra_files=("spk_dict.pt",),  # the voices
    split_stages={
        "thinker": ("Qwen2_5OmniThinkerForConditionalGeneration", "thinker_config"),
        "talker": ("Qwen2_5OmniTalkerForConditionalGeneration", "talker_config"),
        "code2wav": ("Qwen2_5OmniToken2WavModel", "token2wav_config"),
    },
    repos=("Qwen/Qwen2.5-Omni-7B", "Qwen/Qwen2.5-Omni-3B"),
    words=("qwen", "thinker", "talker", "token2wav", "code2wav", "voice"),
    processors={"qwen25_omni_thinker": _thinker, "qwen25_omni_talker": _talker},
    executors=(Code2WavKind(),),
    worker_hooks={"qwen25_omni_talker": _talker_hook},
    vllm_models={
        "Qwen2_5OmniTalkerForCodec": (
            "vllm_omni.models.qwen2_5_omni.talker_model:Qwen25OmniTalkerForCodec"
        )
    },
    api=_speech_api,
    pinned=_pinned,
    tiny_models={
        "qwen2.5-omni": TinyModel(
            build_qwen25_omni, ("Qwen/Qwen2.5-Omni-7B", "Qwen/Qwen2.5-Omni-3B")
        ),
    },
)
