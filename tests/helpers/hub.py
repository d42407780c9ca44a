# SPDX-License-Identifier: Apache-2.0
"""huggingface_hub pointed at a test's cache, in this process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def offline_hub_at(cache: Path) -> Iterator[None]:
    """huggingface_hub in this process reads `cache`, offline (it reads its environment once,
    at import, so its constants are set instead)."""
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        yield
