# SPDX-License-Identifier: Apache-2.0
"""What a stage that runs a pipeline's own call reports once it is up."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_omni.diffusion.executor_kind import ImageStageInfo


@dataclass(frozen=True)
class PipelineStageInfo(ImageStageInfo):
    """An image stage that runs a pipeline's own call: its class, what its `__call__` takes, and
    whether a request must give an input image (an editing pipeline's) or may (FLUX.2's
    reference images)."""

    pipeline_class: str
    call_args: frozenset[str]
    needs_image: bool = False
