# SPDX-License-Identifier: Apache-2.0
"""AuraFlow (diffusers `AuraFlowPipeline`): one process stage holding the whole pipeline, its UMT5
text encoder, the MMDiT step-batched across requests of one image size (runner.py), and the
VAE."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from vllm_omni.diffusion.executor_kind import ImageKind, StageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.step_loop import StepwiseKind
from vllm_omni.models.aura_flow.graph import stage_graph
from vllm_omni.models.aura_flow.tiny import build_aura_flow
from vllm_omni.registry import ModelFamily, TinyModel

DEFAULT_GUIDANCE_SCALE = 3.5  # AuraFlowPipeline.__call__'s


@dataclass(frozen=True)
class AuraFlowSamplingParams(DiffusionSamplingParams):
    """An image request as AuraFlow runs it: classifier-free guidance (a second row, against the
    negative prompt, empty if none) whenever `guidance_scale > 1`, as `AuraFlowPipeline`
    decides."""

    @property
    def do_cfg(self) -> bool:
        scale = DEFAULT_GUIDANCE_SCALE if self.guidance_scale is None else self.guidance_scale
        return scale > 1


class AuraFlowDiT(ImageKind, StepwiseKind):
    name = "aura_flow"

    def runner(self, pipe, config, device):
        from vllm_omni.models.aura_flow.runner import AuraFlowRunner

        return AuraFlowRunner(pipe, device)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        """As any image stage's, with the pipeline's guidance scale where none is given."""
        params = super().validate(params, stage, scheduler, info)
        if params.guidance_scale is None:
            params = replace(params, guidance_scale=DEFAULT_GUIDANCE_SCALE)
        return AuraFlowSamplingParams(**{f.name: getattr(params, f.name) for f in fields(params)})

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        return {}  # the stage encodes its prompts itself


FAMILY = ModelFamily(
    name="aura_flow",
    graph=stage_graph,
    pipeline_classes=("AuraFlowPipeline",),
    repos=("fal/AuraFlow-v0.3", "fal/AuraFlow-v0.2", "fal/AuraFlow"),
    words=("aura_flow", "auraflow"),
    executors=(AuraFlowDiT(),),
    tiny_models={"aura-flow": TinyModel(build_aura_flow, ("fal/AuraFlow-v0.3",))},
)
