# SPDX-License-Identifier: Apache-2.0
"""The transformers functions this family's code follows; tests/test_patches.py fails when
transformers changes one of them, so an upgrade forces a review."""

from __future__ import annotations


def pinned() -> list:
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    from vllm_omni._patches import Pinned

    model = hf.Qwen3OmniMoeForConditionalGeneration
    return [
        Pinned(
            model,
            "generate",
            "90a16e7844cb",
            "talker_prompt builds the talker's input as it does (user turns, the assistant "
            "header, the codec's think ids and speaker, the reply's rows, tts_eos then tts_pad); "
            "the talker's sampling defaults and suppressed ids are its.",
        ),
        Pinned(
            model,
            "_get_talker_user_parts",
            "e299766aaad7",
            "talker_prompt: multimodal tokens of user turns take hidden_projection of the "
            "accepted layer, the others text_projection of their embedding.",
        ),
        Pinned(
            model,
            "_get_talker_assistant_parts",
            "20850a1f1664",
            "talker_prompt: the assistant header's 3 rows, 4 tts_pad rows, tts_bos, the first "
            "reply token; codec ids from the fourth row on.",
        ),
        Pinned(
            hf.Qwen3OmniMoeTalkerForConditionalGeneration,
            "prepare_inputs_for_generation",
            "e071eb0691cf",
            "talker_model runs the code predictor as it does: from the talker's last hidden "
            "state and the frame's first code, one group a pass, the input the sum of the "
            "frame's code embeddings and the next text row.",
        ),
        Pinned(
            hf.Qwen3OmniMoeCode2Wav,
            "chunked_decode",
            "2fe800347edb",
            "code2wav decodes whole requests with it and streamed chunks as it cuts them "
            "(left context, its samples dropped).",
        ),
    ]
