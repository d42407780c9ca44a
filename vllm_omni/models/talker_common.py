# SPDX-License-Identifier: Apache-2.0
"""What the talker stages of the Omni families share: reading rows of the thinker's embedding
table, the thinker's finished output as a one-item stream, the seeds of talker segments, and
the M-RoPE positions of talker tokens after a thinker prompt (`talker_positions`).

A talker speaks in segments, each a vLLM request that continues the one before it (the family's
`talker.py`); seeded sampling draws anew in every request, so each segment seeds its own draws
from the request's seed and its index (`segment_seed`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_omni.errors import FieldError


def thinker_embedding_rows(folder: Path, token_ids: list[int]) -> torch.Tensor:
    """Rows of the thinker's input embedding table, read from the checkpoint without loading it."""
    from safetensors import safe_open

    name = "thinker.model.embed_tokens.weight"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = [folder / json.loads(index.read_text())["weight_map"][name]]
    else:
        files = sorted(folder.glob("*.safetensors"))
    for path in files:
        with safe_open(str(path), "pt") as f:
            if name in f.keys():
                table = f.get_slice(name)
                return torch.stack([table[i : i + 1][0] for i in token_ids])
    raise FieldError("model", f"no {name} in {folder}")


def draws_from_seed(params) -> bool:
    """Whether these SamplingParams sample from a seed of their own."""
    from vllm.sampling_params import SamplingType

    return params.sampling_type == SamplingType.RANDOM_SEED


def segment_seed(seed: int, segment: int) -> int:
    """The seed of a talker segment: the same whenever the segment runs."""
    return int(np.random.SeedSequence([seed, segment]).generate_state(1)[0])


async def finished_thinker(inputs: dict[str, Any]):
    """The thinker's finished outputs as the one item of a stage stream."""
    yield {k: inputs.get(k) for k in ("thinker_states", "prompt_token_ids")}, True


def talker_positions(table: torch.Tensor | None, start: int, n: int) -> torch.Tensor:
    """[3, n] M-RoPE positions of talker tokens start .. start + n - 1, as transformers' talker
    computes them: the thinker prompt's rope index `table` ([3, prompt]) for the prompt, then
    each later token one past the previous on all three axes (index + the prompt's rope delta).
    Without a table: plain 1-D positions on all three axes."""
    index = torch.arange(start, start + n)
    if table is None:
        return index.expand(3, n).clone()
    prompt = table.shape[1]
    delta = int(table.max()) + 1 - prompt if prompt else 0
    positions = (index + delta).expand(3, n).clone()
    inside = index < prompt
    positions[:, inside] = table[:, index[inside]]
    return positions
