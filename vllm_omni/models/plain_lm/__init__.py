# SPDX-License-Identifier: Apache-2.0
"""Any transformers language model no other family claims: one AR stage, vLLM's own server."""

from vllm_omni.models.plain_lm.graph import stage_graph
from vllm_omni.models.plain_lm.tiny import build_llama_8l, build_qwen2_2l
from vllm_omni.registry import PLAIN_LM, ModelFamily, TinyModel

FAMILY = ModelFamily(
    name=PLAIN_LM,
    graph=stage_graph,
    tiny_models={
        "llama-8l": TinyModel(build_llama_8l),
        "qwen2-2l": TinyModel(build_qwen2_2l, ("Qwen/Qwen2.5-0.5B-Instruct",)),
    },
)
