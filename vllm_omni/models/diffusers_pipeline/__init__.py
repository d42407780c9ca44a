# SPDX-License-Identifier: Apache-2.0
"""Any diffusers text-to-image or image-editing pipeline no other family claims: one process
stage in which each request runs the pipeline's own `__call__` (its text encoders included),
step-batched by the framework's call loop."""

from vllm_omni.models.diffusers_pipeline.graph import stage_graph
from vllm_omni.models.diffusers_pipeline.kinds import PipelineCallKind
from vllm_omni.models.diffusers_pipeline.signature import check_text_to_image
from vllm_omni.models.diffusers_pipeline.tiny import build_sd3
from vllm_omni.models.diffusers_pipeline.tiny_flux import build_flux_dev, build_flux_schnell
from vllm_omni.models.diffusers_pipeline.tiny_flux2 import build_flux2_klein
from vllm_omni.models.diffusers_pipeline.tiny_gemma import build_lumina2, build_sana
from vllm_omni.registry import ANY_PIPELINE, ModelFamily, TinyModel

FAMILY = ModelFamily(
    name=ANY_PIPELINE,
    graph=stage_graph,
    executors=(PipelineCallKind(),),
    serves_pipeline=check_text_to_image,
    tiny_models={
        "sd3": TinyModel(build_sd3, ("stabilityai/stable-diffusion-3.5-medium",)),
        "flux-dev": TinyModel(build_flux_dev, ("black-forest-labs/FLUX.1-dev",)),
        "flux-schnell": TinyModel(build_flux_schnell, ("black-forest-labs/FLUX.1-schnell",)),
        "flux2-klein": TinyModel(build_flux2_klein, ("black-forest-labs/FLUX.2-klein-4B",)),
        "sana": TinyModel(build_sana, ("Efficient-Large-Model/Sana_1600M_1024px_diffusers",)),
        "lumina2": TinyModel(build_lumina2, ("Alpha-VLLM/Lumina-Image-2.0",)),
    },
)
