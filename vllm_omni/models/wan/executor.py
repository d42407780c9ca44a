# SPDX-License-Identifier: Apache-2.0
"""Wan's stage: the whole pipeline in the stage process (vLLM has no UMT5, so the text encoder
runs here, batched over new requests), run step-wise by WanRunner; the VAE decodes here too.
In `fifo` mode a group's requests run all their steps together before the next group starts."""

from __future__ import annotations

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig, resolve_device
from vllm_omni.diffusion.executor_kind import VideoStageInfo
from vllm_omni.diffusion.params import INPUT_IMAGES
from vllm_omni.diffusion.pipeline_loader import stage_pipeline
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput
from vllm_omni.diffusion.step_loop import execute_steps, execute_whole
from vllm_omni.errors import FieldError
from vllm_omni.models.wan.runner import WanRunner
from vllm_omni.models.wan.vae_norm import use_fast_norms

DEFAULT_SHAPE = (81, 480, 832)  # the pipelines' own defaults: frames, height, width
IMAGE_TO_VIDEO = "WanImageToVideoPipeline"


class WanExecutor:
    def __init__(self, config: DiTConfig, cache: DiTCacheManager, pipe=None) -> None:
        self.device = resolve_device(config.device)
        self.pipe = stage_pipeline(config, self.device, pipe)
        use_fast_norms(self.pipe.vae)
        name = type(self.pipe).__name__
        transformer = self.pipe.transformer or self.pipe.transformer_2
        multiple = self.pipe.vae_scale_factor_spatial * transformer.config.patch_size[1]
        self._info = VideoStageInfo(
            DEFAULT_SHAPE,
            multiple,
            frame_step=self.pipe.vae_scale_factor_temporal,
            image_to_video=name == IMAGE_TO_VIDEO,
            two_experts=self.pipe.config.get("boundary_ratio") is not None,
            pipeline_class=name,
        )
        self.runner = WanRunner(
            self.pipe, cache, self.device, self._info.image_to_video, config.residual_cache
        )
        self.cache = cache

    @property
    def info(self) -> VideoStageInfo:
        return self._info

    def check_request(self, request: DiTRequest) -> None:
        if not isinstance(request.inputs.get("prompt"), str):
            raise FieldError("prompt", "a Wan stage takes a text prompt")
        given = bool(request.inputs.get(INPUT_IMAGES))
        if given != self._info.image_to_video:
            raise FieldError(
                INPUT_IMAGES,
                f"{self._info.pipeline_class} "
                + (
                    "needs the first frame as an input image"
                    if not given
                    else "takes no input image"
                ),
            )

    def estimate_bytes(self, request: DiTRequest) -> int:
        p = request.params
        latent_frames = (p.num_frames - 1) // self.pipe.vae_scale_factor_temporal + 1
        f = self.pipe.vae_scale_factor_spatial
        channels = self.pipe.vae.config.z_dim * (3 if self._info.image_to_video else 1)
        latents = latent_frames * (p.height // f) * (p.width // f) * channels * 4
        return latents + 3 * p.num_frames * p.height * p.width  # and the frames it returns

    def stats(self) -> dict[str, int]:
        forwards = self.runner.cached_forwards
        return {
            "residual_computed_rows": sum(f.cache.num_computed_rows for f in forwards),
            "residual_cached_rows": sum(f.cache.num_cached_rows for f in forwards),
        }

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput:
        if scheduled.new_request_ids:
            self.runner.prepare([requests[rid] for rid in scheduled.new_request_ids])
        groups = [[requests[rid] for rid in group] for group in scheduled.groups]
        if scheduled.mode == "step":
            return DiTRunnerOutput(*execute_steps(self.runner, groups))
        return DiTRunnerOutput(*execute_whole(self.runner, groups))
