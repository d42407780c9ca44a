# SPDX-License-Identifier: Apache-2.0
"""SLOParamsValidator: rejects bad per-request SLOs at the API server (HTTP 400), and requests
whose TTFT SLO cannot be met (HTTP 429, with admission control on).

vLLM calls `validate_params` of each configured logits processor in the front-end process for
every request, and turns a ValueError into a 400 response (and a GracefulHTTPError into its own
status) - the one vLLM hook that sees a request's `vllm_xargs` before the engine does. The
processor itself changes nothing.
"""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import LogitsProcessor

from vllm_omni.cpp.slo import SLOTargets, request_slo
from vllm_omni.cpp.slo_frontend import check_admission

QUALNAME = "vllm_omni.cpp.slo_validation:SLOParamsValidator"  # vLLM: "<module>:<type>"


class SLOParamsValidator(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        request_slo(sampling_params.extra_args, SLOTargets())  # raises, naming the field
        check_admission(sampling_params.extra_args)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update) -> None:
        pass
