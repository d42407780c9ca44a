# SPDX-License-Identifier: Apache-2.0
"""What a Wan stage reports once it is up."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_omni.diffusion.executor_kind import StageInfo


@dataclass(frozen=True)
class VideoStageInfo(StageInfo):
    """A video stage: its default (frames, height, width), what height and width must divide
    by, whether it animates an input image (image-to-video) and has two experts (Wan2.2's
    high- and low-noise transformers), and its pipeline class."""

    default_shape: tuple[int, int, int]
    size_multiple: int
    image_to_video: bool
    two_experts: bool
    pipeline_class: str
