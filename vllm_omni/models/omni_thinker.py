# SPDX-License-Identifier: Apache-2.0
"""The thinker stage the Omni families share (Qwen2.5-Omni's processor `qwen25_omni_thinker`;
Qwen3-Omni's subclasses it): generates text on vLLM's own thinker model and hands on every
token's hidden state.

Its worker's `hidden_states` hook (vllm_omni.worker.hidden_states) returns every token's last
hidden state and input embedding with the output, so the thinker hands on, besides its text,
`thinker_states` [prompt + reply - 1 tokens, 2 x hidden] ([hidden | embedding]); the talker
speaks from them (each family's `talker.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_omni.engine.ar_processor import Generator
from vllm_omni.errors import FieldError


class ThinkerGenerator(Generator):
    takes_messages = True
    hands_on_hidden_states = True

    def engine_defaults(self) -> dict[str, Any]:
        from vllm_omni.worker.hooks import with_worker_hooks

        args = {
            # Cached prompt positions are never computed, so their rows would be missing.
            "enable_prefix_caching": False,
            "async_scheduling": False,
        }
        return with_worker_hooks(args, "hidden_states")

    async def run(
        self, stage, request_id: str, inputs: dict[str, Any], params, emit=None
    ) -> dict[str, Any]:
        prompt = inputs.get("prompt")
        if inputs.get("messages") is not None:
            prompt = await render_chat(stage.engine, inputs["messages"])
        final, sent, rows = None, 0, []
        try:
            async for out in stage.engine.generate(prompt, params, request_id):
                final = out
                delta: dict[str, Any] = {}
                text = out.outputs[0].text
                if len(text) > sent:
                    delta["text"], sent = text[sent:], len(text)
                new_rows = stage.hidden_states.take(request_id)
                if new_rows is not None:  # what the talker can speak from, so far
                    if not rows:  # the prompt's length travels once, with the first rows
                        delta["prompt_token_ids"] = list(out.prompt_token_ids)
                    rows.append(new_rows)
                    delta["thinker_states"] = new_rows
                if emit is not None and delta:
                    emit(delta)
        finally:
            last = stage.hidden_states.take(request_id)
        rows += [last] if last is not None else []
        states = torch.cat(rows) if rows else None
        completion = final.outputs[0]
        return {
            "text": completion.text,
            "token_ids": list(completion.token_ids),
            "prompt_token_ids": list(final.prompt_token_ids),
            "finish_reason": completion.finish_reason,
            "thinker_states": states,
        }


async def render_chat(engine, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """vLLM's own chat rendering: the model's chat template, and images/audio parsed as vLLM's
    chat API parses them. Malformed messages raise ValueError naming `messages`."""
    from vllm.renderers.params import ChatParams

    params = ChatParams(chat_template_kwargs={"add_generation_prompt": True})
    try:
        _, prompt = await engine.renderer.render_messages_async(messages, params)
    except Exception as e:  # vLLM raises several kinds for bad content; all are the client's
        raise FieldError("messages", f"{e}") from None
    return prompt
