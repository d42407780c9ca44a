# SPDX-License-Identifier: Apache-2.0
"""Any diffusers text-to-audio pipeline no other family claims (sound, music): one process stage
in which each request runs the pipeline's own `__call__` (its text encoder included),
step-batched by the framework's call loop, served as `/v1/audio/speech` in OpenAI's shape."""

from vllm_omni.models.diffusers_pipeline.graph import audio_graph
from vllm_omni.models.diffusers_pipeline.kinds import PipelineAudioKind
from vllm_omni.models.diffusers_pipeline.signature import check_text_to_audio
from vllm_omni.models.diffusers_pipeline.tiny_stable_audio import build_stable_audio
from vllm_omni.registry import ModelFamily, TinyModel

FAMILY = ModelFamily(
    name="diffusers_audio_pipeline",
    graph=audio_graph,
    executors=(PipelineAudioKind(),),
    serves_pipeline=check_text_to_audio,
    tiny_models={
        "stable-audio": TinyModel(build_stable_audio, ("stabilityai/stable-audio-open-1.0",)),
    },
)
