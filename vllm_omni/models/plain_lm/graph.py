# SPDX-License-Identifier: Apache-2.0
"""A plain language model's graph: one AR stage."""

from __future__ import annotations

from typing import Any


def stage_graph() -> dict[str, Any]:
    return {
        "model_type": "lm",
        "stages": [{"name": "lm", "engine_type": "AR", "model": ".", "final_output": True}],
    }
