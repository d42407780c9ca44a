# SPDX-License-Identifier: Apache-2.0
"""Which diffusers pipelines are served by their own `__call__`: one that makes an image from a
prompt, optionally editing input images (`image`), a video from a prompt (`num_frames`), or a
clip of audio from a prompt (its length in seconds)."""

from __future__ import annotations

import inspect

TEXT_TO_IMAGE_ARGS = ("prompt", "height", "width", "num_inference_steps", "generator")
"""What the executor passes to every pipeline it serves."""
INPUT_MEDIA_ARGS = ("mask_image", "control_image", "video", "num_frames", "audio")
"""Arguments of pipelines that take or make other media (inpainting, control, video, audio)."""
TEXT_TO_VIDEO_ARGS = (*TEXT_TO_IMAGE_ARGS, "num_frames", "output_type")
"""What the executor passes to every video pipeline it serves (`output_type`: frames as arrays)."""
DURATION_ARGS = ("audio_end_in_s", "audio_length_in_s")
"""How audio pipelines name the clip's length in seconds (Stable Audio's, AudioLDM's)."""
TEXT_TO_AUDIO_ARGS = ("prompt", "num_inference_steps", "generator")
"""What the executor passes to every audio pipeline it serves, beside the clip's length."""
IMAGE_ARG = "image"
"""The input image(s) of a pipeline that edits images."""


def call_args(pipeline_class: type) -> frozenset[str]:
    """The named parameters of the pipeline's `__call__`."""
    parameters = inspect.signature(pipeline_class.__call__).parameters
    return frozenset(name for name in parameters if name != "self")


def _pipeline_call_args(class_name: str) -> frozenset[str]:
    import diffusers

    pipeline_class = getattr(diffusers, class_name, None)
    if not (
        isinstance(pipeline_class, type) and issubclass(pipeline_class, diffusers.DiffusionPipeline)
    ):
        raise ValueError(f"is not a pipeline class of diffusers {diffusers.__version__}")
    return call_args(pipeline_class)


def check_text_to_image(class_name: str) -> None:
    """Raise ValueError saying why diffusers' `class_name` cannot be served (the reason
    reads after "... of class X, which"): it must make an image from a prompt at a requested
    size, and may edit input images."""
    args = _pipeline_call_args(class_name)
    media = [name for name in INPUT_MEDIA_ARGS if name in args]
    if media:
        raise ValueError(
            f"takes {media[0]!r}: only text-to-image and image-editing pipelines are served"
        )
    missing = [name for name in TEXT_TO_IMAGE_ARGS if name not in args]
    if missing:
        raise ValueError(
            f"is not a text-to-image or image-editing pipeline (its __call__ takes no {missing})"
        )


def check_text_to_video(class_name: str) -> None:
    """Raise ValueError saying why diffusers' `class_name` cannot be served as a video pipeline
    (the reason reads after "... of class X, which"): it must make a video from a prompt alone
    at a requested size and frame count."""
    args = _pipeline_call_args(class_name)
    if "num_frames" not in args:
        raise ValueError("makes no video (its __call__ takes no 'num_frames')")
    inputs = (IMAGE_ARG, *(name for name in INPUT_MEDIA_ARGS if name != "num_frames"))
    media = [name for name in inputs if name in args]
    if media:
        raise ValueError(f"takes {media[0]!r}: only text-to-video pipelines are served as video")
    missing = [name for name in TEXT_TO_VIDEO_ARGS if name not in args]
    if missing:
        raise ValueError(f"is not a text-to-video pipeline (its __call__ takes no {missing})")


def check_text_to_audio(class_name: str) -> None:
    """Raise ValueError saying why diffusers' `class_name` cannot be served as an audio pipeline
    (the reason reads after "... of class X, which"): it must make a clip of a requested length
    from a prompt alone."""
    args = _pipeline_call_args(class_name)
    if not any(name in args for name in DURATION_ARGS):
        raise ValueError(f"makes no audio clip (its __call__ takes none of {list(DURATION_ARGS)})")
    media = [name for name in (IMAGE_ARG, *INPUT_MEDIA_ARGS) if name in args]
    if media:
        raise ValueError(f"takes {media[0]!r}: only text-to-audio pipelines are served as audio")
    missing = [name for name in TEXT_TO_AUDIO_ARGS if name not in args]
    if missing:
        raise ValueError(f"is not a text-to-audio pipeline (its __call__ takes no {missing})")
