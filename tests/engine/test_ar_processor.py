# SPDX-License-Identifier: Apache-2.0
"""The prompt encoder's pure logic: which prompts it encodes, how they are wrapped, which rows
of the encoder's hidden states it keeps (what diffusers keeps, so the embeddings match)."""

from __future__ import annotations

import torch

from vllm_omni.engine.ar_processor import Generator, PromptEncoder


def test_prompts_are_wrapped_in_the_template_one_tensor_each() -> None:
    encoder = PromptEncoder("<s>{}</s>", drop_tokens=2, max_tokens=3)
    assert encoder.prompts({"prompt": "a cat"}) == {"prompt_embeds": "<s>a cat</s>"}
    both = encoder.prompts({"prompt": "a", "negative_prompt": "b", "messages": None})
    assert both == {"prompt_embeds": "<s>a</s>", "negative_prompt_embeds": "<s>b</s>"}


def test_rows_after_the_template_prefix_are_kept_up_to_the_limit() -> None:
    encoder = PromptEncoder("{}", drop_tokens=2, max_tokens=3)
    states = torch.arange(7.0)[:, None].expand(7, 4)
    assert encoder.output(states)[:, 0].tolist() == [2.0, 3.0, 4.0]
    assert encoder.output(states[:4])[:, 0].tolist() == [2.0, 3.0]
    # The encoder is causal: tokens past the kept rows change nothing, so they are not sent.
    assert encoder.max_input_tokens == 5
    assert encoder.engine_defaults()["max_model_len"] == 5


def test_a_generator_s_defaults_say_it_needs_nothing_special() -> None:
    class Plain(Generator):
        pass

    plain = Plain()
    assert plain.takes_user_params and not plain.takes_messages
    assert not plain.hands_on_hidden_states and plain.request_options == ()
    assert plain.engine_defaults() == {} and plain.default_params() is None
    plain.check_options({"anything": 1})  # no options, nothing to refuse
