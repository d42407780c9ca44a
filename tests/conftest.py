# SPDX-License-Identifier: Apache-2.0
"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.models.tiny import build_tiny_models, default_models_dir


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """All tiny models (name -> folder), built once into the shared cache and reused after."""
    return build_tiny_models(default_models_dir())
