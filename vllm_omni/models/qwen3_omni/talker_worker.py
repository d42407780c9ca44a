# SPDX-License-Identifier: Apache-2.0
"""The Qwen3-Omni talker stage's worker hook (`qwen3_omni_talker`): each step's per-token inputs
for `Qwen3OmniTalkerForCodec`, and the frames' residual codes back to the stage.

A talker request carries its thinker rows in `SamplingParams.extra_args[PAYLOAD_KEY]` (built by
`vllm_omni.models.qwen3_omni.talker_prompt.talker_prompt`): row j conditions position j, the last
row every later position. Positions from the prompt's length on hold a frame's first code; the
model's code predictor adds the frame's other codes from the talker's hidden state at the
position before, which this hook keeps per request between steps (`_previous`). The codes of
each request's frames are kept too (a request recomputed after a preemption reuses them) and
leave with the step's sampled token as its output's `pooling_output` ([frames, G - 1], float32),
where the stage's `HiddenStatesTap` takes them.

Needs eager execution (the inputs change every step) and synchronous scheduling; the talker's
stage processor sets both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.outputs import ModelRunnerOutput

from vllm_omni.models.qwen3_omni.talker_model import TalkerStep
from vllm_omni.models.talker_common import talker_positions
from vllm_omni.worker.hidden_states import scheduled_spans
from vllm_omni.worker.hooks import PassThroughHook

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

PAYLOAD_KEY = "omni_qwen3_talker"


def encode_payload(
    rows: torch.Tensor,
    hidden: torch.Tensor,
    codec_from: int,
    prompt_len: int,
    known: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The talker's rows as plain msgpack values, to ride in SamplingParams.extra_args.
    `known` [frames, G - 1]: the residual codes of the frames a continuing request's prompt
    already holds (after the talker prompt's `prompt_len` positions). `positions`: the talker
    prompt's [3, prompt_len] M-RoPE positions, where not 1-D."""
    array = rows.detach().to("cpu", torch.float32).contiguous().numpy()
    codes = known.detach().to("cpu", torch.int64).contiguous().numpy()
    extra = {}
    if positions is not None:
        table = positions.detach().to("cpu", torch.int64).contiguous().numpy()
        extra = {"positions": table.tobytes(), "positions_shape": list(table.shape)}
    return {
        **extra,
        "rows": array.tobytes(),
        "shape": list(array.shape),
        "hidden": hidden.to(torch.uint8).numpy().tobytes(),
        "codec_from": int(codec_from),
        "prompt_len": int(prompt_len),
        "known": codes.tobytes(),
        "known_shape": list(codes.shape),
    }


def decode_payload(payload: dict[str, Any]):
    """(rows, hidden, codec_from, prompt_len, known, positions), as `encode_payload` takes
    them."""
    rows = np.frombuffer(payload["rows"], dtype=np.float32).reshape(payload["shape"])
    hidden = np.frombuffer(payload["hidden"], dtype=np.uint8).astype(bool)
    known = np.frombuffer(payload["known"], dtype=np.int64).reshape(payload["known_shape"])
    positions = None
    if "positions" in payload:
        table = np.frombuffer(payload["positions"], dtype=np.int64)
        positions = torch.from_numpy(table.reshape(payload["positions_shape"]).copy())
    return (
        torch.from_numpy(rows.copy()),
        torch.from_numpy(hidden.copy()),
        int(payload["codec_from"]),
        int(payload["prompt_len"]),
        torch.from_numpy(known.copy()),
        positions,
    )


class TalkerRequest:
    """What the hook keeps of one talker request between steps."""

    def __init__(self, payload: dict[str, Any], params, device) -> None:
        rows, hidden, self.codec_from, self.prompt_len, known, self.positions = decode_payload(
            payload
        )
        self.rows, self.hidden = rows.to(device), hidden.to(device)
        self.greedy = params.temperature < 1e-5
        self.generator = None
        if not self.greedy and params.seed is not None:
            self.generator = torch.Generator(device).manual_seed(params.seed)
        # residual codes of each frame so far (those the prompt holds were sent before)
        self.frames: list[torch.Tensor] = list(known.to(device))
        self.previous: tuple[int, torch.Tensor] | None = None  # (position, hidden state)
        self.unsent: list[torch.Tensor] = []


class TalkerStepHook(PassThroughHook):
    """The worker hook `qwen3_omni_talker` (registered by the family)."""

    def install(self) -> None:
        runner = self.worker.model_runner
        forward = runner._model_forward
        self._requests: dict[str, TalkerRequest] = {}
        self._spans: dict[str, tuple[int, int]] | None = None

        def stepped_forward(*args, **kwargs):
            order = self._set_step(kwargs.get("input_ids"))
            if order and kwargs.get("positions") is not None:
                kwargs["positions"] = self._mrope_positions(kwargs["positions"], order)
            try:
                out = forward(*args, **kwargs)
                if order:
                    self._keep_results(order)
                return out
            finally:
                runner.model.set_step(None)

        # An instance attribute on this worker's own runner: the runner class stays untouched.
        runner._model_forward = stepped_forward

    def _request(self, req_id: str) -> TalkerRequest | None:
        if req_id not in self._requests:
            runner = self.worker.model_runner
            params = runner.requests[req_id].sampling_params
            payload = (params.extra_args or {}).get(PAYLOAD_KEY) if params else None
            if payload is None:
                return None
            self._requests[req_id] = TalkerRequest(payload, params, runner.device)
        return self._requests[req_id]

    def _set_step(self, input_ids: torch.Tensor | None) -> list[tuple[str, int, int]]:
        """Hands the model this step's TalkerStep; returns (request, first index in the batch,
        tokens) in batch order (empty for a warm-up or profiling run)."""
        runner = self.worker.model_runner
        if self._spans is None or input_ids is None:
            runner.model.set_step(None)
            return []
        model, device = runner.model, runner.device
        groups = model.num_code_groups - 1
        rows, hidden, codec, order = [], [], [], []
        frame_tokens, known, previous, greedy, generators = [], [], [], [], []
        offset = 0
        for req_id in runner.input_batch.req_ids:
            start, n = self._spans[req_id]
            order.append((req_id, offset, n))
            request = self._request(req_id)
            if request is None:  # no payload: the codec embedding alone
                rows.append(torch.zeros(n, model.config.talker.thinker_hidden_size, device=device))
                hidden.append(torch.zeros(n, dtype=torch.bool, device=device))
                codec.append(torch.ones(n, 1, device=device))
                offset += n
                continue
            positions = torch.arange(start, start + n, device=device)
            index = positions.clamp(max=request.rows.shape[0] - 1)
            rows.append(request.rows[index])
            hidden.append(request.hidden[index] & (positions < request.hidden.shape[0]))
            codec.append((positions >= request.codec_from).float()[:, None])
            for p in range(max(start, request.prompt_len), start + n):
                frame = p - request.prompt_len
                frame_tokens.append(offset + p - start)
                if frame < len(request.frames):
                    known.append(request.frames[frame])
                    previous.append(torch.zeros(model.config.hidden_size, device=device))
                else:
                    if request.previous is None or request.previous[0] != p - 1:
                        raise RuntimeError(f"talker request {req_id}: no hidden state at {p - 1}")
                    known.append(torch.full((groups,), -1, dtype=torch.long, device=device))
                    previous.append(request.previous[1])
                greedy.append(request.greedy)
                generators.append(request.generator)
            offset += n
        dtype = model.model.codec_embedding.weight.dtype
        model.set_step(
            TalkerStep(
                rows=torch.cat(rows),
                hidden=torch.cat(hidden),
                codec=torch.cat(codec).to(dtype),
                frame_tokens=torch.tensor(frame_tokens, dtype=torch.long, device=device),
                known=torch.stack(known) if known else torch.zeros(0, groups, dtype=torch.long),
                previous=torch.stack(previous).to(dtype) if previous else torch.zeros(0),
                greedy=torch.tensor(greedy, dtype=torch.bool),
                generators=generators,
            )
        )
        return order

    def _mrope_positions(
        self, positions: torch.Tensor, order: list[tuple[str, int, int]]
    ) -> torch.Tensor:
        """The runner's 1-D positions -> [3, tokens] where a scheduled request has 3-D ones
        (an image or video prompt); the model's layers rotate with M-RoPE, which takes 1-D
        positions as they are."""
        out = None
        for req_id, offset, n in order:
            request = self._requests.get(req_id)
            if request is None or request.positions is None:
                continue
            out = positions.expand(3, -1).clone() if out is None else out
            start, _ = self._spans[req_id]
            table = talker_positions(request.positions, start, n)
            out[:, offset : offset + n] = table.to(out)
        return positions if out is None else out

    def _keep_results(self, order: list[tuple[str, int, int]]) -> None:
        """After the forward: each request's last hidden state, and its new frames' codes (in
        the order of the step's frame tokens)."""
        frames, hidden = self.worker.model_runner.model.step_results
        done = 0
        for req_id, offset, n in order:
            request = self._requests.get(req_id)
            if request is None:
                continue
            start, _ = self._spans[req_id]
            request.previous = (start + n - 1, hidden[offset + n - 1].clone())
            for p in range(max(start, request.prompt_len), start + n):
                if p - request.prompt_len == len(request.frames):  # new, not recomputed
                    request.frames.append(frames[done].clone())
                    request.unsent.append(frames[done].clone())
                done += 1

    def execute_model(self, scheduler_output: SchedulerOutput, call_next):
        for req_id in scheduler_output.finished_req_ids:
            self._requests.pop(req_id, None)
        self._spans = scheduled_spans(scheduler_output)
        try:
            return call_next(scheduler_output)
        finally:
            self._spans = None

    def sample_tokens(self, grammar_output, call_next):
        out = call_next(grammar_output)
        if not isinstance(out, ModelRunnerOutput):
            return out
        codes: list[torch.Tensor | None] = []
        for i, req_id in enumerate(out.req_ids):
            request = self._requests.get(req_id)
            if request is not None and request.unsent and out.sampled_token_ids[i]:
                codes.append(torch.stack(request.unsent).float().cpu())
                request.unsent = []
            else:
                codes.append(None)
        if any(c is not None for c in codes):
            out.pooler_output = codes
        return out
