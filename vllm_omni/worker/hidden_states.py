# SPDX-License-Identifier: Apache-2.0
"""The worker hook `hidden_states`: a generating vLLM worker also returns each token's last
hidden state.

Qwen2.5-Omni's talker reads, for every prompt and reply token of the thinker, the thinker's last
hidden state (after the final norm) plus that token's input embedding. vLLM computes both while it
generates, and its `ModelRunnerOutput.pooler_output` carries per-request tensors back to the
engine; this worker fills it for generation requests too:

- after each forward it keeps the rows of every scheduled token as `[hidden | embedding]`
  (width 2 x hidden; the embedding is zero at multimodal placeholder tokens, as transformers
  feeds the talker); for an M-RoPE model (3-D positions: Qwen2.5-Omni's thinker) the rows are
  float32 and end with the token's 3 position ids (exact in float32), which the talker's
  prompt reuses: transformers gives the talker the thinker prompt's own rope index;
- rows of a prefill that has not reached its first sampled token wait here and leave with that
  token, so every output that carries rows also carries a token (vLLM's output processor and
  its time-to-first-token stay as they are);
- each position is delivered once: a preempted request recomputed from the start sends only
  the positions it had not sent.

The client side (`vllm_omni.engine.hidden_states_tap`) takes the rows out of the outputs before
vLLM's output processor sees them. Needs synchronous scheduling and no prefix caching (cached
positions are never computed, so their rows would be missing); the thinker's stage processor
sets both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.distributed.parallel_state import get_pp_group
from vllm.v1.outputs import ModelRunnerOutput

from vllm_omni.worker.hooks import PassThroughHook

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

PLACEHOLDER_FIELDS = (
    *("audio_token_index", "image_token_index", "video_token_index"),  # Qwen2.5-Omni's names
    *("audio_token_id", "image_token_id", "video_token_id"),  # Qwen3-Omni's
)


def scheduled_spans(scheduler_output: SchedulerOutput) -> dict[str, tuple[int, int]]:
    """Request id -> (first position, number of tokens) computed in this step."""
    spans = {}
    for req in scheduler_output.scheduled_new_reqs:
        spans[req.req_id] = (
            req.num_computed_tokens,
            scheduler_output.num_scheduled_tokens[req.req_id],
        )
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens):
        spans[req_id] = (num_computed, scheduler_output.num_scheduled_tokens[req_id])
    return spans


def placeholder_ids(config) -> list[int]:
    """Token ids of multimodal placeholders, from the model's config or, for a model served from
    a composite checkpoint, the sub-config that has them."""
    from transformers import PretrainedConfig

    configs = [config] + [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]
    for candidate in configs:
        found = [getattr(candidate, f, None) for f in PLACEHOLDER_FIELDS]
        if any(i is not None for i in found):
            return [i for i in found if i is not None]
    return []


class HiddenStatesHook(PassThroughHook):
    """The worker hook `hidden_states` (vllm_omni.worker.hooks)."""

    def install(self) -> None:
        runner = self.worker.model_runner
        forward = runner._model_forward
        self._pending: dict[str, list[torch.Tensor]] = {}  # rows not yet sent, per request
        self._next_position: dict[str, int] = {}  # first position not yet captured
        self._spans: dict[str, tuple[int, int]] = {}
        self._placeholders = torch.tensor(
            placeholder_ids(runner.model_config.hf_config), device=runner.device
        )

        layer = self.capture_layer()
        if layer is not None:
            self._add_layer_output(layer)

        def capturing_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            rows = out
            if layer is not None and isinstance(out, tuple):
                rows = out[1][0]  # the layer's output, vLLM's auxiliary hidden state
            if get_pp_group().is_last_rank and not isinstance(rows, tuple):
                self._capture(rows, kwargs.get("positions"))
            return out

        # An instance attribute on this worker's own runner: the runner class stays untouched.
        runner._model_forward = capturing_forward

    def capture_layer(self) -> int | None:
        """Whose hidden states the rows carry: None for the final (normed) ones, k for the
        output of the first k decoder layers (transformers' `hidden_states[k]`)."""
        return None

    def _add_layer_output(self, layer: int) -> None:
        """Have the model return the output of `layer` as its one auxiliary hidden state (vLLM's
        EAGLE-3 interface), set right after the model loads: the profiling run, torch.compile and
        graph capture all see that forward, and the runner unpacks what it returns."""
        runner = self.worker.model_runner
        load = runner.load_model

        def load_with_layer_output(*args, **kwargs):
            load(*args, **kwargs)
            runner.get_model().set_aux_hidden_state_layers((layer,))
            runner.use_aux_hidden_state_outputs = True

        runner.load_model = load_with_layer_output

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        from vllm.model_executor.models.interfaces import supports_multimodal

        model = self.worker.model_runner.model
        if supports_multimodal(model):
            model = model.get_language_model()
        embeds = model.embed_input_ids(token_ids)
        if self._placeholders.numel():
            is_placeholder = torch.isin(token_ids, self._placeholders)
            embeds = embeds.masked_fill(is_placeholder[:, None], 0)
        return embeds

    def _capture(self, hidden_states: torch.Tensor, positions: torch.Tensor | None) -> None:
        runner = self.worker.model_runner
        req_ids = runner.input_batch.req_ids
        total = sum(self._spans[r][1] for r in req_ids)
        token_ids = runner.input_ids.gpu[:total]
        parts = [hidden_states[:total], self._embed(token_ids)]
        if positions is not None and positions.dim() == 2:  # M-RoPE: [3, tokens]
            parts = [p.float() for p in parts] + [positions[:, :total].T.float()]
        rows = torch.cat(parts, dim=-1)
        rows = rows.to("cpu", copy=True)  # the runner reuses its buffers next step
        offset = 0
        for req_id in req_ids:
            start, n = self._spans[req_id]
            chunk, offset = rows[offset : offset + n], offset + n
            captured = self._next_position.get(req_id, 0)
            if start + n <= captured:
                continue  # recomputed after a preemption: captured already
            self._pending.setdefault(req_id, []).append(chunk[max(0, captured - start) :])
            self._next_position[req_id] = start + n

    def execute_model(self, scheduler_output: SchedulerOutput, call_next):
        for req_id in scheduler_output.finished_req_ids:
            self._pending.pop(req_id, None)
            self._next_position.pop(req_id, None)
        self._spans = scheduled_spans(scheduler_output)
        return call_next(scheduler_output)

    def sample_tokens(self, grammar_output, call_next):
        out = call_next(grammar_output)
        if not isinstance(out, ModelRunnerOutput) or not self._pending:
            return out
        # Rows leave with a sampled token; a step that samples nothing for a request (a prefill
        # chunk short of the prompt's end) keeps them here for the next one.
        rows: list[torch.Tensor | None] = []
        for i, req_id in enumerate(out.req_ids):
            pending = self._pending.get(req_id) if out.sampled_token_ids[i] else None
            if pending:
                del self._pending[req_id]
                rows.append(pending[0] if len(pending) == 1 else torch.cat(pending))
            else:
                rows.append(None)
        if any(r is not None for r in rows):
            out.pooler_output = rows
        return out
