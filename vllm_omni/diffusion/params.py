# SPDX-License-Identifier: Apache-2.0
"""Per-request parameters of an image-diffusion stage, validated at construction, and what the
orchestrator fills in before a request runs (`validate_image_params`). Other executors bring
their own parameter classes (the ProcessParams protocol, vllm_omni.diffusion.executor_kind)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from PIL import Image

from vllm_omni.errors import FieldError

INPUT_IMAGES = "image"
"""The request option that carries an edit's input images."""

OUTPUT_TYPES = ("pil", "latent")


@dataclass(frozen=True)
class DiffusionSamplingParams:
    """What a DiT stage needs to turn prompt embeddings into an image.

    `height`/`width` of None take the pipeline's default size. `seed` of None draws a fresh one
    (the output reports it, so any image can be reproduced). Classifier-free guidance runs only
    with a `negative_prompt` and `true_cfg_scale > 1`, as in diffusers' Qwen-Image pipeline.
    `guidance_scale`: for pipelines run by their own call that take one (Stable Diffusion 3, Flux,
    Z-Image: their own guidance rules); None keeps the pipeline's default.
    `cache_threshold`: this request's first-block residual caching threshold (None: the stage's
    `residual_cache` setting; 0: off; docs/dit_acceleration.md); step scheduling only.
    `latency_slo_ms`: end-to-end latency target; the DiT stage turns it into `deadline`
    (wall-clock seconds, `time.time()`, counted from when the request entered the omni engine),
    which a `deadline` scheduling policy serves least-slack-first.
    """

    height: int | None = None
    width: int | None = None
    num_inference_steps: int = 50
    true_cfg_scale: float = 4.0
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    seed: int | None = None
    output_type: str = "pil"
    cache_threshold: float | None = None
    latency_slo_ms: float | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        for name in ("latency_slo_ms", "deadline"):
            value = getattr(self, name)
            if value is not None and (not is_finite(value) or value <= 0):
                raise FieldError(name, f"must be None or a positive number, got {value!r}")
        t = self.cache_threshold
        if t is not None and (not is_finite(t) or not 0 <= t <= 1):
            raise FieldError("cache_threshold", f"must be None or a number in [0, 1], got {t!r}")
        for name in ("height", "width"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value <= 0):
                raise FieldError(name, f"must be a positive integer, got {value!r}")
        if not is_int(self.num_inference_steps) or not 1 <= self.num_inference_steps <= 1000:
            raise FieldError(
                "num_inference_steps",
                f"must be an integer in [1, 1000], got {self.num_inference_steps!r}",
            )
        if isinstance(self.true_cfg_scale, bool) or not isinstance(
            self.true_cfg_scale, (int, float)
        ):
            raise FieldError("true_cfg_scale", f"must be a number, got {self.true_cfg_scale!r}")
        if self.true_cfg_scale < 0:
            raise FieldError("true_cfg_scale", f"must be >= 0, got {self.true_cfg_scale}")
        g = self.guidance_scale
        if g is not None and (not is_finite(g) or g < 0):
            raise FieldError("guidance_scale", f"must be None or a number >= 0, got {g!r}")
        if self.negative_prompt is not None and not isinstance(self.negative_prompt, str):
            raise FieldError(
                "negative_prompt", f"must be a string, got {type(self.negative_prompt)}"
            )
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise FieldError("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        if self.output_type not in OUTPUT_TYPES:
            raise FieldError(
                "output_type", f"must be one of {OUTPUT_TYPES}, got {self.output_type!r}"
            )

    @property
    def do_cfg(self) -> bool:
        return self.negative_prompt is not None and self.true_cfg_scale > 1

    @property
    def total_steps(self) -> int:
        return self.num_inference_steps

    @property
    def rows(self) -> int:
        """Transformer rows one step takes: the prompt's, and the negative prompt's under
        guidance."""
        return 2 if self.do_cfg else 1

    def step_key(self, inputs: Mapping[str, Any]) -> Hashable:
        """Equal image sizes share a transformer call, whatever their step, prompt or guidance;
        an edit's input images must have equal sizes too (their latents join each row's
        sequence). In the stage process input images are arrays (height, width, channels)."""
        images = inputs.get(INPUT_IMAGES)
        if not images:
            return (self.height, self.width)
        return (self.height, self.width, tuple(image.shape[:2] for image in images))

    def call_key(self, inputs: Mapping[str, Any]) -> Hashable:
        return (
            self.height,
            self.width,
            self.num_inference_steps,
            self.true_cfg_scale,
            self.guidance_scale,
            self.do_cfg,
            self.negative_prompt is not None,
            self.output_type,
        )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DiffusionSamplingParams:
        return params_from_dict(cls, values, "diffusion")


def check_shared_fields(params: Any) -> None:
    """The checks of the fields every kind of request's parameters has (steps, negative prompt,
    seed, residual-cache threshold, SLO and deadline); raises FieldError naming the field."""
    steps = params.num_inference_steps
    if not is_int(steps) or not 1 <= steps <= 1000:
        raise FieldError("num_inference_steps", f"must be an integer in [1, 1000], got {steps!r}")
    if params.negative_prompt is not None and not isinstance(params.negative_prompt, str):
        raise FieldError("negative_prompt", f"must be a string, got {type(params.negative_prompt)}")
    if params.seed is not None and (not is_int(params.seed) or not 0 <= params.seed < 2**63):
        raise FieldError("seed", f"must be an integer in [0, 2**63), got {params.seed!r}")
    t = params.cache_threshold
    if t is not None and (not is_finite(t) or not 0 <= t <= 1):
        raise FieldError("cache_threshold", f"must be None or a number in [0, 1], got {t!r}")
    for name in ("latency_slo_ms", "deadline"):
        value = getattr(params, name)
        if value is not None and (not is_finite(value) or value <= 0):
            raise FieldError(name, f"must be None or a positive number, got {value!r}")


def params_from_dict(cls: type, values: dict[str, Any], what: str) -> Any:
    """A parameter dataclass from a dict, refusing a key that is not one of its fields."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise FieldError(unknown[0], f"unknown {what} parameter; known: {sorted(known)}")
    return cls(**values)


def stage_params(params: Any, cls: type, stage: str, what: str) -> Any:
    """A request's parameters for `stage`: `cls()` for None, else `params` if it is a `cls`
    (FieldError naming the stage's parameters otherwise)."""
    if params is None:
        return cls()
    if not isinstance(params, cls):
        raise FieldError(
            f"sampling_params.{stage}",
            f"{what} stage takes {cls.__name__}, got {type(params).__name__}",
        )
    return params


def slo_deadline(params: Any) -> float | None:
    """The request's deadline: its own, else its latency SLO counted from now."""
    if params.deadline is None and params.latency_slo_ms is not None:
        return time.time() + params.latency_slo_ms / 1000
    return params.deadline


def check_cache_scheduler(threshold: float | None, stage: str, scheduler: str) -> None:
    """A request's residual-caching threshold needs a stage that schedules steps."""
    if threshold and scheduler != "step":
        raise FieldError(
            "cache_threshold",
            f"residual caching needs step-level scheduling; stage "
            f"{stage!r} runs whole requests ({scheduler!r})",
        )


def check_size_multiple(params: Any, multiple: int) -> None:
    for name in ("height", "width"):
        if getattr(params, name) % multiple:
            raise FieldError(name, f"must be a multiple of {multiple}, got {getattr(params, name)}")


def validate_image_params(
    params: Any, stage: str, scheduler: str, default_size: tuple[int, int], multiple: int
) -> DiffusionSamplingParams:
    """A request's image parameters with size and seed filled in and the SLO turned into a
    deadline; raises ValueError naming the field the stage cannot serve."""
    params = stage_params(params, DiffusionSamplingParams, stage, "an image")
    check_cache_scheduler(params.cache_threshold, stage, scheduler)
    height, width = default_size
    params = replace(
        params,
        height=params.height or height,
        width=params.width or width,
        seed=params.seed if params.seed is not None else random.randrange(2**63),
        deadline=slo_deadline(params),  # the SLO counts from here
    )
    check_size_multiple(params, multiple)
    return params


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_input_images(value: Any, pipeline_class: str, limit: int) -> list[Image.Image]:
    """A request's input images as a list, or ValueError naming the field."""
    images = value if isinstance(value, list) else [value]
    if not images or not all(isinstance(image, Image.Image) for image in images):
        raise FieldError(INPUT_IMAGES, "must be a PIL image or a non-empty list of them")
    if len(images) > limit:
        raise FieldError(
            INPUT_IMAGES,
            f"{pipeline_class} takes at most {limit} input image(s), got {len(images)}",
        )
    return images
