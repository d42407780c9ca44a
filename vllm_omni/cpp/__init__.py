# SPDX-License-Identifier: Apache-2.0
"""CPP: chunked pipeline parallelism with compute-balanced chunks (see docs/cpp.md)."""

from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.engine_args import cpp_engine_args

__all__ = ["CPPConfig", "cpp_engine_args"]
