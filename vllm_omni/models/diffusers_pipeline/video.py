# SPDX-License-Identifier: Apache-2.0
"""Any diffusers text-to-video pipeline no other family claims: one process stage in which each
request runs the pipeline's own `__call__` (its text encoder included), step-batched by the
framework's call loop, served as video jobs."""

from vllm_omni.models.diffusers_pipeline.graph import video_graph
from vllm_omni.models.diffusers_pipeline.kinds import PipelineVideoKind
from vllm_omni.models.diffusers_pipeline.signature import check_text_to_video
from vllm_omni.models.diffusers_pipeline.tiny_cogvideox import build_cogvideox
from vllm_omni.registry import ModelFamily, TinyModel

FAMILY = ModelFamily(
    name="diffusers_video_pipeline",
    graph=video_graph,
    executors=(PipelineVideoKind(),),
    serves_pipeline=check_text_to_video,
    tiny_models={
        "cogvideox": TinyModel(build_cogvideox, ("zai-org/CogVideoX-2b", "THUDM/CogVideoX-2b")),
    },
)
