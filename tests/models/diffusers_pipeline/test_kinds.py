# SPDX-License-Identifier: Apache-2.0
"""The pipeline-call executor kind's request handling, without a pipeline."""

from __future__ import annotations

from vllm_omni.models.diffusers_pipeline.kinds import edit_size


def test_default_size_of_a_whole_pipeline_follows_the_input_image():
    assert edit_size((2048, 1024), (1024, 1024), 16) == (720, 1456)  # (height, width)
    assert edit_size((64, 64), (1024, 1024), 16) == (1024, 1024)
    assert edit_size((10, 1000), (64, 64), 16) == (640, 16)  # tall and narrow
