# SPDX-License-Identifier: Apache-2.0
"""What runs in a process stage, and what the orchestrator must know about it.

A process stage (`engine_type: DiT`) runs a loop of its own (vllm_omni.diffusion.engine_core):
the DiffusionScheduler picks requests, a `StageExecutor` runs them. Model families bring their
executors as an `ExecutorKind`, registered by name (a stage's `executor:`), which says both
sides of it:

- in the stage process: `build` the StageExecutor;
- in the orchestrator: the parameters a request takes (`params_type`, `default_params`,
  `validate`), the request options it reads (`request_options`, `apply_options`), how its raw
  result becomes the stage's named outputs (`outputs`), and, for a stage that can start before
  its source has finished (`stream_input`), how it consumes the source's stream (`stream`).

The engine, the scheduler and the server call these methods and never ask which model runs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch
from PIL import Image

from vllm_omni.diffusion.audio_params import AudioSamplingParams, resolve_audio
from vllm_omni.diffusion.params import (
    INPUT_IMAGES,
    DiffusionSamplingParams,
    validate_image_params,
)
from vllm_omni.diffusion.video_params import VideoSamplingParams, resolve_video
from vllm_omni.errors import FieldError

if TYPE_CHECKING:
    from vllm_omni.diffusion.cache_manager import DiTCacheManager
    from vllm_omni.diffusion.config import DiTConfig
    from vllm_omni.diffusion.request import DiTRequest
    from vllm_omni.diffusion.scheduler import DiTRunnerOutput, DiTSchedulerOutput


@dataclass(frozen=True)
class StageInfo:
    """What a stage process reports once it is up. Executors with more to say subclass it
    (ImageStageInfo; a family's own)."""


@dataclass(frozen=True)
class ImageStageInfo(StageInfo):
    """A stage that makes images: its default `(height, width)`, what sizes must divide by, the
    optional fields of DiffusionSamplingParams it cannot take (`refuses`: a request that sets one
    is refused naming it, and the server leaves them out of its published schema), and how many
    input images a request may give it (`max_input_images`: an editing stage's; 0 for none)."""

    default_size: tuple[int, int]
    size_multiple: int
    refuses: frozenset[str] = field(default=frozenset(), kw_only=True)
    max_input_images: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class VideoStageInfo(StageInfo):
    """A stage that makes videos, as its family declares it: its default (frames, height,
    width) and frame rate, what height and width must divide by, what frame counts must be
    (`frame_step` k + 1, at most `max_frames`), whether it animates an input image
    (image-to-video), how many experts split its denoising steps (2: a high- and a low-noise
    transformer, each with its own guidance scale), and its pipeline class (for errors)."""

    default_shape: tuple[int, int, int]
    size_multiple: int
    frame_step: int
    default_fps: float
    image_to_video: bool
    pipeline_class: str
    num_experts: int = 1
    max_frames: int = 1001

    def __post_init__(self) -> None:
        if self.frame_step < 1:
            raise ValueError(f"frame_step: must be >= 1, got {self.frame_step}")
        if self.num_experts not in (1, 2):
            raise ValueError(f"num_experts: must be 1 or 2, got {self.num_experts}")


@dataclass(frozen=True)
class AudioStageInfo(StageInfo):
    """A stage that makes audio from a prompt: its sample rate and channels (1 or 2), its
    default and longest clip in seconds, and its pipeline class (for errors)."""

    sample_rate: int
    channels: int
    default_seconds: float
    max_seconds: float
    pipeline_class: str

    def __post_init__(self) -> None:
        if self.channels not in (1, 2):
            raise ValueError(f"channels: must be 1 or 2, got {self.channels}")
        if not 0 < self.default_seconds <= self.max_seconds:
            raise ValueError(
                f"default_seconds: must be in (0, max_seconds={self.max_seconds}], got "
                f"{self.default_seconds}"
            )


class ProcessParams(Protocol):
    """What the stage loop reads of a request's parameters, whatever the executor."""

    seed: int | None

    @property
    def deadline(self) -> float | None: ...

    @property
    def total_steps(self) -> int:
        """Engine steps the request takes in step mode (denoising steps)."""
        ...

    @property
    def rows(self) -> int:
        """Model rows one of its steps takes (1, and 1 more per guidance branch): what the
        deadline policy prices a step by."""
        ...

    def step_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """Requests with equal keys share one model call in step mode."""
        ...

    def call_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """Requests with equal keys share one whole-request call (fifo mode)."""
        ...


class StageExecutor(Protocol):
    """Runs what the DiffusionScheduler scheduled, in the stage process."""

    @property
    def info(self) -> StageInfo: ...

    def check_request(self, request: DiTRequest) -> None:
        """Raise ValueError naming the field for a request that would fail mid-step."""
        ...

    def estimate_bytes(self, request: DiTRequest) -> int: ...

    def execute_model(
        self, scheduled: DiTSchedulerOutput, requests: dict[str, DiTRequest]
    ) -> DiTRunnerOutput: ...

    def stats(self) -> dict[str, Any]:
        """Counters of the executor's own (merged into the stage's stats)."""
        ...


Emit = Callable[[dict[str, Any]], None]


class ExecutorKind:
    """One registered process-stage executor. Subclasses set `name` and `params_type` and
    implement `build`, `validate` and `outputs`; the rest has defaults."""

    name: ClassVar[str]
    params_type: ClassVar[type]
    whole_requests: ClassVar[bool] = False
    """Runs whole requests only: `fifo` is its default and only scheduler."""
    residual_cache: ClassVar[bool] = False
    """Supports first-block residual caching (`dit.residual_cache`, step scheduler)."""
    request_options: ClassVar[tuple[str, ...]] = ()
    """Request-level options (fields of the prompt mapping) that `apply_options` reads."""
    cpu_defaults: ClassVar[Mapping[str, Any]] = {}
    """DiTConfig fields set on a CPU where the stage's `dit:` leaves them unset."""
    streams: ClassVar[bool] = False
    """Whether `stream` is implemented (a `stream_input` stage needs it)."""

    def build(self, config: DiTConfig, cache: DiTCacheManager, pipe: Any = None) -> StageExecutor:
        """In the stage process. `pipe`: an already built pipeline, where the executor takes one."""
        raise NotImplementedError

    def default_params(self) -> Any:
        return self.params_type()

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        """`params` with the request's options (the prompt mapping's fields) applied; raises
        ValueError naming the field for inputs the stage cannot take. Runs before `validate`."""
        return params

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        """Fill in what the request left open (size, seed); raise ValueError naming the field."""
        raise NotImplementedError

    def with_negative_prompt(self, params: Any, inputs: Mapping[str, Any]) -> Any:
        """`params` (the kind's defaults for None) with the prompt mapping's negative prompt
        where it gives one; parameters of another type are left for `validate` to refuse."""
        params = params or self.params_type()
        negative = inputs.get("negative_prompt")
        if negative is not None and isinstance(params, self.params_type):
            params = replace(params, negative_prompt=negative)
        return params

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        """Fields the validated parameters add to the request's prompt inputs (what the stages
        before this one must encode, e.g. a negative prompt given in the parameters)."""
        return {}

    def outputs(self, result: Any, info: StageInfo) -> dict[str, Any]:
        """The stage's named outputs from one request's raw result."""
        raise NotImplementedError

    async def stream(
        self, stage: Any, request_id: str, upstream: Any, params: Any, emit: Emit | None
    ) -> dict[str, Any]:
        """Consume the source's stream (vllm_omni.engine.stage_stream), submitting work to `stage`
        (its `submit(request_id, inputs, params)`) as it goes; emit partial outputs."""
        raise NotImplementedError(f"executor {self.name!r} does not stream its input")


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over a stage's result (results cross the process boundary as numpy arrays); a
    copy if the array is read-only (a Ray actor's result, mapped from the object store), which
    torch would share without guarding it."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


class ImageKind(ExecutorKind):
    """An executor that turns prompt embeddings into images (or latents), with
    DiffusionSamplingParams. Families subclass it with their `name` and `build`."""

    params_type = DiffusionSamplingParams
    request_options = ("negative_prompt",)

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        negative = inputs.get("negative_prompt")
        if negative is None:
            return params
        return replace(params or DiffusionSamplingParams(), negative_prompt=negative)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        assert isinstance(info, ImageStageInfo), info
        params = validate_image_params(
            params, stage, scheduler, info.default_size, info.size_multiple
        )
        for name in sorted(info.refuses):
            if getattr(params, name) is not None:
                raise FieldError(name, f"stage {stage!r} takes no {name}")
        return params

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        # Guidance needs the negative prompt encoded, also when it came in the parameters.
        return {"negative_prompt": params.negative_prompt} if params.do_cfg else {}

    def outputs(self, result: Any, info: StageInfo) -> dict[str, Any]:
        if isinstance(result, np.ndarray) and result.dtype != np.uint8:
            return {"latents": as_tensor(result)}
        return {"image": result}


class VideoKind(ExecutorKind):
    """An executor that makes videos (a stage whose info is a VideoStageInfo), with
    VideoSamplingParams: the negative prompt, an image-to-video stage's first frame, frames,
    size, rate and seed filled in from what the stage declares, `{"video", "fps"}` out.
    Families subclass it with their `name` and `build` (or `StepwiseKind`'s `runner`)."""

    params_type = VideoSamplingParams
    request_options = ("negative_prompt", INPUT_IMAGES)

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        """The negative prompt; image-to-video's first frame, which it needs (one image)."""
        assert isinstance(info, VideoStageInfo), info
        params = self.with_negative_prompt(params, inputs)
        image = inputs.get(INPUT_IMAGES)
        if image is None:
            if info.image_to_video:
                raise FieldError(
                    INPUT_IMAGES, f"{info.pipeline_class} animates an image: give the first frame"
                )
            return params
        if not info.image_to_video:
            raise FieldError(INPUT_IMAGES, f"{info.pipeline_class} takes no input image")
        images = image if isinstance(image, list) else [image]
        if len(images) != 1 or not isinstance(images[0], Image.Image):
            raise FieldError(INPUT_IMAGES, "must be one PIL image (the first frame)")
        return params

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        assert isinstance(info, VideoStageInfo), info
        return resolve_video(params, stage, scheduler, info)

    def outputs(self, result: Any, info: StageInfo) -> dict[str, Any]:
        return {"video": result["video"], "fps": result["fps"]}


class AudioKind(ExecutorKind):
    """An executor that makes audio from a prompt (a stage whose info is an AudioStageInfo),
    with AudioSamplingParams: the negative prompt, the length and seed filled in from what the
    stage declares, `{"audio": (samples,) or (channels, samples), "sample_rate"}` out."""

    params_type = AudioSamplingParams
    request_options = ("negative_prompt",)

    def apply_options(self, params: Any, inputs: Mapping[str, Any], info: StageInfo) -> Any:
        return self.with_negative_prompt(params, inputs)

    def validate(self, params: Any, stage: str, scheduler: str, info: StageInfo) -> Any:
        assert isinstance(info, AudioStageInfo), info
        return resolve_audio(params, stage, scheduler, info)

    def outputs(self, result: Any, info: StageInfo) -> dict[str, Any]:
        assert isinstance(info, AudioStageInfo), info
        return {"audio": as_tensor(result), "sample_rate": info.sample_rate}
