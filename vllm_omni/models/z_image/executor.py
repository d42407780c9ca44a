# SPDX-License-Identifier: Apache-2.0
"""Z-Image's DiT stage: the pipeline without its text encoder (the prompt embeddings come from
the encoder stage), run step-wise by ZImageRunner. In `fifo` mode a group's requests run all
their steps together before the next group starts."""

from __future__ import annotations

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig, resolve_device
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.pipeline_loader import stage_pipeline
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.diffusion.step_loop import execute_steps, execute_whole
from vllm_omni.models.z_image.runner import ZImageRunner

DEFAULT_SIZE = (1024, 1024)  # the pipeline's own default
REFUSES = frozenset({"cache_threshold"})
"""Residual caching is Qwen-Image's (its transformer's blocks); Z-Image's has none yet."""


class ZImageExecutor:
    def __init__(self, config: DiTConfig, cache: DiTCacheManager, pipe=None) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        # The text encoder is the encoder stage's.
        self.pipe = stage_pipeline(config, self.device, pipe, ("text_encoder", "tokenizer"))
        self.runner = ZImageRunner(self.pipe, cache, self.device)

    @property
    def info(self) -> ImageStageInfo:
        multiple = self.pipe.vae_scale_factor * 2
        return ImageStageInfo(DEFAULT_SIZE, multiple, refuses=REFUSES)

    def check_request(self, request: DiTRequest) -> None:
        pass

    def estimate_bytes(self, request: DiTRequest) -> int:
        p = request.params
        latents = (p.height // 8) * (p.width // 8) * self.pipe.transformer.in_channels * 4
        embeds = sum(t.numel() * t.element_size() for t in request.inputs.values())
        return latents + embeds

    def stats(self) -> dict[str, int]:
        return {}

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        for request_id in scheduled.new_request_ids:
            self.runner.prepare(requests[request_id])
        groups = [[requests[rid] for rid in group] for group in scheduled.groups]
        if scheduled.mode == "step":
            return DiTRunnerOutput(*execute_steps(self.runner, groups))
        return DiTRunnerOutput(*execute_whole(self.runner, groups))
