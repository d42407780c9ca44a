# SPDX-License-Identifier: Apache-2.0
"""The executor that serves a whole diffusers pipeline, as registered: `diffusers_pipeline`."""

from __future__ import annotations

from typing import Any

from vllm_omni.diffusion.executor_kind import ImageKind, StageInfo
from vllm_omni.diffusion.params import validate_image_params
from vllm_omni.errors import FieldError
from vllm_omni.models.diffusers_pipeline.info import PipelineStageInfo


class WholePipelineKind(ImageKind):
    """Requests run whole (`fifo`): those sharing size, steps and guidance go into one call."""

    name = "diffusers_pipeline"
    whole_requests = True

    def build(self, config, cache, pipe: Any = None):
        from vllm_omni.models.diffusers_pipeline.executor import WholePipelineExecutor

        return WholePipelineExecutor(config, cache, pipe)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        assert isinstance(info, PipelineStageInfo), info
        params = validate_image_params(
            params, stage, scheduler, info.default_size, info.size_multiple
        )
        for name in ("guidance_scale", "negative_prompt"):
            if getattr(params, name) is not None and name not in info.call_args:
                raise FieldError(name, f"{info.pipeline_class} takes no {name}")
        if params.output_type != "pil":
            raise FieldError(
                "output_type",
                f"a pipeline served whole returns images ('pil'), not {params.output_type!r}",
            )
        return params

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        return {}  # the pipeline encodes its prompts itself
