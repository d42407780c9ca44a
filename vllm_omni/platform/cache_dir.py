# SPDX-License-Identifier: Apache-2.0
"""Where the package keeps what it derives on this machine (CPP calibrations, combined model
folders): `$VLLM_OMNI_CACHE_DIR`, else `~/.cache/vllm_omni`."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "VLLM_OMNI_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "vllm_omni"))
