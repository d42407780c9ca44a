# SPDX-License-Identifier: Apache-2.0
"""HiddenStatesTap: the client side of `vllm_omni.worker.hidden_states`.

The capturing worker attaches each generation step's hidden-state rows as the output's
`pooling_output`. vLLM's output processor takes any output with a pooling tensor for a pooling
request (and would drop its tokens), so the tap takes the rows out first and keeps them per
request; the output then goes through vLLM's processor unchanged. It wraps `process_outputs` of
one engine's own OutputProcessor instance (the class stays untouched); the vLLM internals it
relies on are pinned in `vllm_omni._patches.PINNED` and checked by tests/test_patches.py.
"""

from __future__ import annotations

from typing import Any

import torch


class HiddenStatesTap:
    def __init__(self, engine: Any) -> None:
        processor = engine.output_processor
        self._states = processor.request_states
        self._process_outputs = processor.process_outputs
        self._rows: dict[str, list[torch.Tensor]] = {}
        processor.process_outputs = self._take_rows_then_process

    def _take_rows_then_process(self, engine_core_outputs, *args, **kwargs):
        for output in engine_core_outputs:
            if output.pooling_output is None or not output.new_token_ids:
                continue  # a pooling request's output, or nothing captured
            state = self._states.get(output.request_id)
            if state is None:
                continue  # aborted meanwhile
            self._rows.setdefault(state.external_req_id, []).append(output.pooling_output)
            output.pooling_output = None
        return self._process_outputs(engine_core_outputs, *args, **kwargs)

    def take(self, request_id: str) -> torch.Tensor | None:
        """The rows that arrived for `request_id` since the last call, in position order."""
        rows = self._rows.pop(request_id, None)
        if not rows:
            return None
        return rows[0] if len(rows) == 1 else torch.cat(rows)
