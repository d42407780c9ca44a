# SPDX-License-Identifier: Apache-2.0
"""Loggers that print with vLLM's: vLLM configures handlers for the "vllm" logger namespace only."""

import logging

from vllm.logger import init_logger as vllm_init_logger


def init_logger(name: str) -> logging.Logger:
    return vllm_init_logger(f"vllm.{name}")
