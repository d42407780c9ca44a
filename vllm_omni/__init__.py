# SPDX-License-Identifier: Apache-2.0
"""vllm_omni: chunked pipeline parallelism and multi-stage (omni) serving on stock vLLM 0.32.

Importing this package has no side effects on vLLM; the vLLM plugin entry point
(`vllm_omni.plugin:register`) applies everything that must run inside vLLM's processes.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vllm-omni")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
