# SPDX-License-Identifier: Apache-2.0
"""The omni OpenAI-compatible server (image generation over a stage graph)."""
