# SPDX-License-Identifier: Apache-2.0
"""What a stage that serves a whole pipeline reports once it is up."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_omni.diffusion.executor_kind import ImageStageInfo


@dataclass(frozen=True)
class PipelineStageInfo(ImageStageInfo):
    """An image stage that calls a whole pipeline: its class and what its `__call__` takes."""

    pipeline_class: str
    call_args: frozenset[str]
