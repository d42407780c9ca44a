# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's executor kinds check a request's parameters before it runs."""

import pytest

from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.kinds import QwenImageDiT
from vllm_omni.models.qwen_image.runner import REFUSES

INFO = ImageStageInfo(default_size=(128, 128), size_multiple=16, refuses=REFUSES)


def test_guidance_scale_is_refused():
    with pytest.raises(FieldError, match="stage 'dit' takes no guidance_scale") as e:
        QwenImageDiT().validate(DiffusionSamplingParams(guidance_scale=3.0), "dit", "step", INFO)
    assert e.value.field == "guidance_scale"


def test_size_and_seed_are_filled_in():
    params = QwenImageDiT().validate(DiffusionSamplingParams(), "dit", "step", INFO)
    assert (params.height, params.width) == (128, 128) and params.seed is not None
