# SPDX-License-Identifier: Apache-2.0
"""Qwen3-Omni's thinker stage (processor `qwen3_omni_thinker`): text on vLLM's own Qwen3-Omni
thinker (its MoE layers on vLLM's fused MoE), handing on what the talker reads.

transformers' `Qwen3OmniMoeForConditionalGeneration.generate` builds the talker's input from two
of the thinker's hidden states per token: its input embedding (`hidden_states[0]`) and the output
of its first `talker_config.accept_hidden_layer` layers (for audio, image and video tokens). The
worker hook `qwen3_omni_thinker` (`AcceptLayerHook`) captures that layer's output through vLLM's
auxiliary hidden states; the generator hands on `thinker_states` [prompt + reply - 1 tokens,
2 x hidden] ([layer output | embedding], then the 3 M-RoPE positions) as Qwen2.5-Omni's does.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.models.omni_thinker import ThinkerGenerator
from vllm_omni.worker.hidden_states import HiddenStatesHook

THINKER_HOOK = "qwen3_omni_thinker"


class Qwen3ThinkerGenerator(ThinkerGenerator):
    def engine_defaults(self) -> dict[str, Any]:
        from vllm_omni.worker.hooks import with_worker_hooks

        # Cached prompt positions are never computed, so their rows would be missing.
        args = {"enable_prefix_caching": False, "async_scheduling": False}
        return with_worker_hooks(args, THINKER_HOOK)


class AcceptLayerHook(HiddenStatesHook):
    """The worker hook `qwen3_omni_thinker`: rows carry the output of the thinker's layer
    `talker_config.accept_hidden_layer` instead of its final hidden state."""

    def capture_layer(self) -> int:
        config = self.worker.model_runner.model_config.hf_config
        return int(config.talker_config.accept_hidden_layer)
