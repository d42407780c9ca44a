# SPDX-License-Identifier: Apache-2.0
"""The talker stage's worker hook: sets each step's per-token thinker conditioning on the model.

A talker request carries its conditioning rows in `SamplingParams.extra_args[PAYLOAD_KEY]`
(built by `vllm_omni.models.qwen2_5_omni.talker.talker_input`): row j conditions position j,
the last row every later position (transformers repeats its last text-pad embedding the same
way), and
positions before `codec_from` (the thinker's prompt) leave out the codec embedding. Before each
forward the worker gathers the rows of the scheduled tokens in the runner's batch order and
hands them to `Qwen25OmniTalkerForCodec.set_conditioning`.

The payload may also carry the thinker prompt's M-RoPE positions ([3, prompt]); the worker then
replaces the runner's 1-D positions with `talker_positions` for every scheduled token, as
transformers positions the talker (the model rotates with M-RoPE,
`vllm_omni.models.qwen2_5_omni.talker_model`).

Needs eager execution on CUDA (a captured graph would replay stale conditioning) and
synchronous scheduling; the talker's stage processor sets both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.parallel_state import get_pp_group

from vllm_omni.models.talker_common import talker_positions
from vllm_omni.worker.hidden_states import scheduled_spans
from vllm_omni.worker.hooks import PassThroughHook

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

PAYLOAD_KEY = "omni_talker"


def encode_payload(
    rows: torch.Tensor, codec_from: int, positions: torch.Tensor | None = None
) -> dict[str, Any]:
    """Conditioning rows (and the prompt's [3, prompt] M-RoPE positions, if any) as plain
    msgpack values (bytes), to ride in SamplingParams.extra_args."""
    array = rows.detach().to("cpu", torch.float32).contiguous().numpy()
    payload = {"rows": array.tobytes(), "shape": list(array.shape), "codec_from": int(codec_from)}
    if positions is not None:
        table = positions.detach().to("cpu", torch.int64).contiguous().numpy()
        payload["positions"], payload["positions_shape"] = table.tobytes(), list(table.shape)
    return payload


def decode_payload(payload: dict[str, Any]) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    array = np.frombuffer(payload["rows"], dtype=np.float32).reshape(payload["shape"])
    positions = None
    if "positions" in payload:
        table = np.frombuffer(payload["positions"], dtype=np.int64)
        positions = torch.from_numpy(table.reshape(payload["positions_shape"]).copy())
    return torch.from_numpy(array.copy()), int(payload["codec_from"]), positions


class TalkerConditioningHook(PassThroughHook):
    """The worker hook `qwen25_omni_talker` (registered by the family)."""

    def install(self) -> None:
        runner = self.worker.model_runner
        forward = runner._model_forward
        self._payloads: dict[str, tuple[torch.Tensor, int]] = {}
        self._spans: dict[str, tuple[int, int]] | None = None

        def conditioned_forward(*args, **kwargs):
            if get_pp_group().is_first_rank:
                self._set_conditioning(kwargs.get("input_ids"))
            if getattr(runner.model, "uses_mrope", False) and kwargs.get("positions") is not None:
                kwargs["positions"] = self._mrope_positions(kwargs["positions"])
            try:
                return forward(*args, **kwargs)
            finally:
                if get_pp_group().is_first_rank:
                    runner.model.set_conditioning(None, None)

        # An instance attribute on this worker's own runner: the runner class stays untouched.
        runner._model_forward = conditioned_forward

    def _payload(self, req_id: str) -> tuple[torch.Tensor, int, torch.Tensor | None] | None:
        if req_id not in self._payloads:
            params = self.worker.model_runner.requests[req_id].sampling_params
            payload = (params.extra_args or {}).get(PAYLOAD_KEY) if params else None
            if payload is None:
                return None
            rows, codec_from, positions = decode_payload(payload)
            self._payloads[req_id] = (
                rows.to(self.worker.model_runner.device),
                codec_from,
                positions,
            )
        return self._payloads[req_id]

    def _mrope_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The runner's 1-D positions [padded tokens] -> [3, padded tokens] when a scheduled
        request has 3-D ones (talker_positions); the others and padding keep their 1-D value
        on all three axes. A batch of text prompts keeps the 1-D tensor."""
        if self._spans is None:  # a warm-up or profiling run
            return positions
        out, offset = None, 0
        for req_id in self.worker.model_runner.input_batch.req_ids:
            start, n = self._spans[req_id]
            payload = self._payload(req_id)
            if payload is not None and payload[2] is not None:
                out = positions.expand(3, -1).clone() if out is None else out
                out[:, offset : offset + n] = talker_positions(payload[2], start, n).to(out)
            offset += n
        return positions if out is None else out  # M-RoPE takes 1-D positions as they are

    def _set_conditioning(self, input_ids: torch.Tensor | None) -> None:
        runner = self.worker.model_runner
        if self._spans is None or input_ids is None:  # a warm-up or profiling run
            runner.model.set_conditioning(None, None)
            return
        rows, scales = [], []
        for req_id in runner.input_batch.req_ids:
            start, n = self._spans[req_id]
            positions = torch.arange(start, start + n, device=runner.device)
            payload = self._payload(req_id)
            if payload is None:  # no conditioning: the codec embedding alone
                width = runner.model.config.embedding_size
                rows.append(torch.zeros(n, width, device=runner.device))
                scales.append(torch.ones(n, 1, device=runner.device))
                continue
            table, codec_from, _ = payload
            rows.append(table[positions.clamp(max=table.shape[0] - 1)])
            scales.append((positions >= codec_from).to(table.dtype)[:, None])
        dtype = runner.model.codec_embedding.weight.dtype
        runner.model.set_conditioning(torch.cat(rows).to(dtype), torch.cat(scales).to(dtype))

    def execute_model(self, scheduler_output: SchedulerOutput, call_next):
        for req_id in scheduler_output.finished_req_ids:
            self._payloads.pop(req_id, None)
        self._spans = scheduled_spans(scheduler_output)
        try:
            return call_next(scheduler_output)
        finally:
            self._spans = None
