# SPDX-License-Identifier: Apache-2.0
"""SLOParamsValidator: rejects bad per-request SLOs at the API server (HTTP 400).

vLLM calls `validate_params` of each configured logits processor in the front-end process for
every request, and turns a ValueError into a 400 response - the one vLLM hook that sees a
request's `vllm_xargs` before the engine does. The processor itself changes nothing.
"""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import LogitsProcessor

from vllm_omni.cpp.slo import SLOTargets, request_slo

QUALNAME = "vllm_omni.cpp.slo_validation:SLOParamsValidator"  # vLLM: "<module>:<type>"


class SLOParamsValidator(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        request_slo(sampling_params.extra_args, SLOTargets())  # raises, naming the field

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update) -> None:
        pass
