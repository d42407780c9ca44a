# SPDX-License-Identifier: Apache-2.0
"""Any diffusers text-to-image pipeline no other family claims, served whole: one process stage
that calls the pipeline (its own text encoders included), batching compatible requests into one
call."""

from vllm_omni.models.diffusers_pipeline.graph import stage_graph
from vllm_omni.models.diffusers_pipeline.kinds import WholePipelineKind
from vllm_omni.models.diffusers_pipeline.signature import check_text_to_image
from vllm_omni.models.diffusers_pipeline.tiny import build_sd3
from vllm_omni.registry import ANY_PIPELINE, ModelFamily, TinyModel

FAMILY = ModelFamily(
    name=ANY_PIPELINE,
    graph=stage_graph,
    executors=(WholePipelineKind(),),
    serves_pipeline=check_text_to_image,
    tiny_models={
        "sd3": TinyModel(build_sd3, ("stabilityai/stable-diffusion-3.5-medium",)),
    },
)
