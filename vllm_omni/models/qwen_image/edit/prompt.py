# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image-Edit's text encoder stage: Qwen2.5-VL on vLLM reading the prompt with the input
images, as `QwenImageEditPipeline` and `QwenImageEditPlusPipeline` encode them.

The images are resized here, to the area the pipeline gives its encoder, before vLLM's
Qwen2.5-VL processor fits them to its patch grid; the template's first 64 rows are dropped.
The rows keep the model's M-RoPE positions for image tokens (vLLM's, and transformers' when
given `mm_token_type_ids`); diffusers 0.42 under transformers 5 leaves those out and encodes
the image tokens with text positions (docs/troubleshooting.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_omni.diffusion.params import INPUT_IMAGES as IMAGE_ARG
from vllm_omni.engine.ar_processor import PromptEncoder
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.edit.conditioning import VAE_AREA, area_size

SYSTEM = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should alter "
    "or modify the image. Generate a new image that meets the user's requirements while "
    "maintaining consistency with the original input where appropriate.<|im_end|>\n"
)
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
EDIT_TEMPLATE = SYSTEM + "<|im_start|>user\n" + VISION + "{}<|im_end|>\n<|im_start|>assistant\n"
EDIT_PLUS_TEMPLATE = SYSTEM + "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
EDIT_PLUS_IMAGE_LABEL = "Picture {}: " + VISION
DROP_TOKENS = 64
MAX_TEXT_TOKENS = 1024
"""The pipelines' `max_sequence_length`: the prompt's budget of the encoder's context."""
IMAGE_TOKEN_PIXELS = 28 * 28
"""Pixels per image token: Qwen2.5-VL's 14-pixel patches, merged 2x2."""


@dataclass(frozen=True)
class ImagePromptEncoder(PromptEncoder):
    """`condition_area`: the pixel area each image is resized to for the encoder (its aspect
    kept); `image_label`: a per-image prefix of the prompt (Edit-Plus: "Picture 1: ...") where
    the template has no image placeholder of its own; `max_images` per request."""

    condition_area: int = VAE_AREA
    image_label: str | None = None
    max_images: int = 1

    request_options = (IMAGE_ARG,)

    def engine_defaults(self) -> dict[str, Any]:
        image_tokens = self.max_images * int(self.condition_area * 1.25) // IMAGE_TOKEN_PIXELS
        return {
            **super().engine_defaults(),
            "limit_mm_per_prompt": {"image": self.max_images, "video": 0},
            "max_model_len": self.drop_tokens + MAX_TEXT_TOKENS + image_tokens,
        }

    def prompts(self, inputs: dict[str, Any]) -> dict[str, str]:
        count = len(_given(inputs))
        label = self.image_label or ""
        labels = "".join(label.format(i + 1) for i in range(count))
        out = {}
        for field_name, tensor_name in self.fields:
            text = inputs.get(field_name)
            if text is not None:
                out[tensor_name] = self.template.format(labels + text)
        return out

    def images(self, inputs: dict[str, Any]) -> list[Any]:
        from diffusers.image_processor import VaeImageProcessor

        resizer = VaeImageProcessor()  # the pipelines' resize: PIL, Lanczos
        resized = []
        for image in _given(inputs):
            height, width = area_size(self.condition_area, image.size)
            resized.append(resizer.resize(image.convert("RGB"), height, width))
        return resized


def _given(inputs: dict[str, Any]) -> list[Any]:
    images = inputs.get(IMAGE_ARG)
    if images is None:
        raise FieldError(IMAGE_ARG, "the edit encoder needs the input image")
    return images if isinstance(images, list) else [images]


def edit_encoder(config=None) -> ImagePromptEncoder:
    return ImagePromptEncoder(
        EDIT_TEMPLATE, drop_tokens=DROP_TOKENS, max_tokens=1 << 30, condition_area=VAE_AREA
    )


def edit_plus_encoder(config=None) -> ImagePromptEncoder:
    return ImagePromptEncoder(
        EDIT_PLUS_TEMPLATE,
        drop_tokens=DROP_TOKENS,
        max_tokens=1 << 30,
        condition_area=384 * 384,
        image_label=EDIT_PLUS_IMAGE_LABEL,
        max_images=3,
    )
