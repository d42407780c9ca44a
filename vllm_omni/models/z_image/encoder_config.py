# SPDX-License-Identifier: Apache-2.0
"""How a Z-Image text encoder stage's engine sees the checkpoint's Qwen3 (light: no vLLM model
code; the model itself is text_encoder.py)."""

from __future__ import annotations

import copy

ENCODER_ARCH = "ZImageQwen3TextEncoder"


def encoder_hf_overrides(hf_config):
    """vLLM `hf_overrides`: the checkpoint's Qwen3 config less its last decoder layer. (vLLM
    may call it on a config it already changed, or on a placeholder: left alone.)"""
    if getattr(hf_config, "model_type", None) != "qwen3":
        return hf_config
    if ENCODER_ARCH in (getattr(hf_config, "architectures", None) or ()):
        return hf_config
    config = copy.deepcopy(hf_config)
    config.architectures = [ENCODER_ARCH]
    config.num_hidden_layers -= 1
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    return config
