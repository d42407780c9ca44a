# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni: the MoE thinker (text) on vLLM, handing on what its talker reads."""

from vllm_omni.models.qwen3_omni.graph import stage_graph
from vllm_omni.models.registry import ModelFamily


def _thinker(config):
    from vllm_omni.models.qwen3_omni.thinker import Qwen3ThinkerGenerator

    return Qwen3ThinkerGenerator()


def _thinker_hook() -> type:
    from vllm_omni.models.qwen3_omni.thinker import AcceptLayerHook

    return AcceptLayerHook


FAMILY = ModelFamily(
    name="qwen3_omni",
    graph=stage_graph,
    model_types=("qwen3_omni_moe",),
    split_stages={
        "thinker": ("Qwen3OmniMoeThinkerForConditionalGeneration", "thinker_config"),
    },
    repos=(
        "Qwen/Qwen3-Omni-30B-A3B-Instruct",
        "Qwen/Qwen3-Omni-30B-A3B-Thinking",
        "Qwen/Qwen3-Omni-30B-A3B-Captioner",
    ),
    processors={"qwen3_omni_thinker": _thinker},
    worker_hooks={"qwen3_omni_thinker": _thinker_hook},
)
