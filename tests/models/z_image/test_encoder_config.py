# SPDX-License-Identifier: Apache-2.0
"""The Z-Image encoder stage's view of the checkpoint's Qwen3 (no engine)."""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

from vllm_omni.models.z_image.encoder_config import ENCODER_ARCH, encoder_hf_overrides
from vllm_omni.models.z_image.prompt import TEMPLATE, prompt_encoder


def test_the_encoder_is_qwen3_less_its_last_layer(tiny_models) -> None:
    config = AutoConfig.from_pretrained(tiny_models["z-image"] / "text_encoder")
    layers = config.num_hidden_layers
    changed = encoder_hf_overrides(config)
    assert changed.architectures == [ENCODER_ARCH]
    assert changed.num_hidden_layers == layers - 1 == len(changed.layer_types)
    assert config.num_hidden_layers == layers  # the checkpoint's config is left alone
    assert encoder_hf_overrides(changed) is changed  # applied once, however often it is called
    placeholder = PretrainedConfig()
    assert encoder_hf_overrides(placeholder) is placeholder


def test_the_prompt_is_the_pipelines_chat_turn(tiny_models) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["z-image"] / "tokenizer")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a red cat"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert TEMPLATE.format("a red cat") == rendered
    encoder = prompt_encoder()
    assert encoder.drop_tokens == 0 and encoder.max_input_tokens == 512
    assert encoder.engine_defaults()["hf_overrides"] is encoder_hf_overrides
