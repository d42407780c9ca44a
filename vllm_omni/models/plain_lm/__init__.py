# SPDX-License-Identifier: Apache-2.0
"""Any transformers language model no other family claims: one AR stage, vLLM's own server."""

from vllm_omni.models.plain_lm.graph import stage_graph
from vllm_omni.registry import PLAIN_LM, ModelFamily

FAMILY = ModelFamily(name=PLAIN_LM, graph=stage_graph)
