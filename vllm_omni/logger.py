# SPDX-License-Identifier: Apache-2.0
"""Loggers that print with vLLM's: vLLM configures handlers for the "vllm" logger namespace only.

The DiT stage (`vllm_omni.diffusion`) must import without vLLM (benchmarks/gpu_check.py runs it on
machines where vLLM's CUDA wheel cannot be installed), so without vLLM this falls back to plain
`logging` under the same names.
"""

import logging

try:
    from vllm.logger import init_logger as _vllm_init_logger
except ImportError:  # no vLLM: only the vLLM-free parts (the DiT stage) can be in use
    _vllm_init_logger = logging.getLogger


def init_logger(name: str) -> logging.Logger:
    return _vllm_init_logger(f"vllm.{name}")
