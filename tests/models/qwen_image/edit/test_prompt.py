# SPDX-License-Identifier: Apache-2.0
"""The edit encoder's prompts and images, and the conditioning's sizes (no engine)."""

from __future__ import annotations

import pytest
from PIL import Image

from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.edit.conditioning import EditConditioning
from vllm_omni.models.qwen_image.edit.prompt import VISION, edit_encoder, edit_plus_encoder


def test_edit_puts_its_one_image_in_the_template() -> None:
    encoder = edit_encoder()
    image = Image.new("RGB", (8, 8))
    prompts = encoder.prompts({"prompt": "make it red", "negative_prompt": " ", "image": image})
    assert prompts["prompt_embeds"].count(VISION) == 1
    assert prompts["prompt_embeds"].endswith("make it red<|im_end|>\n<|im_start|>assistant\n")
    assert set(prompts) == {"prompt_embeds", "negative_prompt_embeds"}


def test_edit_plus_labels_each_image() -> None:
    images = [Image.new("RGB", (64, 32)), Image.new("RGB", (32, 32))]
    text = edit_plus_encoder().prompts({"prompt": "swap them", "image": images})["prompt_embeds"]
    assert f"Picture 1: {VISION}Picture 2: {VISION}swap them" in text


def test_images_are_resized_to_the_pipelines_area_keeping_their_aspect() -> None:
    wide = Image.new("RGBA", (200, 100))
    (edit,) = edit_encoder().images({"image": wide})
    assert edit.size == (1440, 736) and edit.mode == "RGB"
    plus = edit_plus_encoder().images({"image": [wide, Image.new("RGB", (50, 50))]})
    assert [image.size for image in plus] == [(544, 256), (384, 384)]


def test_engine_room_for_the_images() -> None:
    plus = edit_plus_encoder().engine_defaults()
    assert plus["limit_mm_per_prompt"]["image"] == 3
    assert plus["max_model_len"] >= 64 + 1024 + 3 * 384 * 384 // (28 * 28)


def test_an_edit_without_an_image_names_the_field() -> None:
    with pytest.raises(FieldError) as e:
        edit_encoder().prompts({"prompt": "x"})
    assert e.value.field == "image"


def test_conditioning_sizes_are_the_pipelines() -> None:
    conditioning = EditConditioning(takes_list=True, max_images=3)
    assert conditioning.vae_size((200, 100)) == (736, 1440)  # (height, width)
    # 2x2 patches of the 8x latents: (736 / 16) * (1440 / 16) rows, plus a 1024x1024 image's
    assert conditioning.latent_tokens([Image.new("RGB", (200, 100))] * 1) == 46 * 90
    square = Image.new("RGB", (10, 10))
    assert conditioning.latent_tokens([square, square]) == 2 * 64 * 64
