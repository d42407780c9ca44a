# SPDX-License-Identifier: Apache-2.0
"""Wan's video executor, as registered: `wan` (the framework's step loop; whole requests with
`fifo`). What a video request takes is every video stage's (VideoKind); what is Wan's - frame
step, frame rate, experts - its runner declares in the stage's VideoStageInfo."""

from __future__ import annotations

from vllm_omni.diffusion.executor_kind import VideoKind
from vllm_omni.diffusion.step_loop import StepwiseKind


class WanVideo(VideoKind, StepwiseKind):
    name = "wan"
    residual_cache = True

    def runner(self, pipe, config, device):
        from vllm_omni.models.wan.runner import WanRunner

        return WanRunner(pipe, config, device)
