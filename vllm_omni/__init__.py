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

# The public API, imported on first use so that `import vllm_omni` (which vLLM's plugin loader
# does in every process) stays cheap.
_LAZY = {
    "OmniLLM": "vllm_omni.entrypoints.omni_llm",
    "AsyncOmniLLM": "vllm_omni.entrypoints.async_omni_llm",
    "DiffusionSamplingParams": "vllm_omni.diffusion.params",
    "Code2WavParams": "vllm_omni.models.qwen2_5_omni.params",
    "VideoSamplingParams": "vllm_omni.diffusion.video_params",
    "AudioSamplingParams": "vllm_omni.diffusion.audio_params",
    "OmniRequestOutput": "vllm_omni.outputs",
    "StageGraph": "vllm_omni.config.stage_config",
    "StageConfig": "vllm_omni.config.stage_config",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm_omni' has no attribute {name!r}")
