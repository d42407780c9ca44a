# SPDX-License-Identifier: Apache-2.0
"""One OmniLLM on the tiny Qwen3-Omni (thinker and talker in float32, eager) and one transformers
reference for the package's engine tests: an engine start costs ~35 s here."""

from __future__ import annotations

import pytest
import torch

from vllm_omni import OmniLLM
from vllm_omni.models.qwen3_omni.thinker import Qwen3ThinkerGenerator


@pytest.fixture(scope="package")
def captured():
    """The thinker stage's outputs per request (its `thinker_states` are not a final output)."""
    found: dict[str, dict] = {}
    run = Qwen3ThinkerGenerator.run

    async def recording_run(self, stage, request_id, inputs, params, emit=None):
        found[request_id] = out = await run(self, stage, request_id, inputs, params, emit)
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Qwen3ThinkerGenerator, "run", recording_run)
        yield found


@pytest.fixture(scope="package")
def omni(tiny_models, captured):
    float32 = {"engine_args": {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True}}
    llm = OmniLLM(
        tiny_models["qwen3-omni"], stage_overrides={"thinker": float32, "talker": float32}
    )
    yield llm
    llm.shutdown()


@pytest.fixture(scope="package")
def hf(tiny_models):
    from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

    folder = tiny_models["qwen3-omni"]
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), AutoProcessor.from_pretrained(folder)
