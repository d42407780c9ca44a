# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-Omni: thinker (text) -> talker (speech codes) -> code2wav (waveform)."""

from vllm_omni.models.qwen2_5_omni.graph import stage_graph
from vllm_omni.models.registry import ModelFamily

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
)
