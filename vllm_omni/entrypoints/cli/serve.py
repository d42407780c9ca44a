# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni serve MODEL` / `vllm serve MODEL --omni`: vLLM's serve command plus omni options
(`--cpp` and `--cpp-*`: chunked pipeline parallelism, see vllm_omni.cpp).

An LM folder is served by vLLM's own OpenAI server (all of vLLM's flags apply). A diffusers
pipeline folder (one with `model_index.json`) needs the multi-stage omni server, which is not
built yet (see docs/architecture.md); it gets a clear error instead of a confusing vLLM one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm.entrypoints.cli.serve import ServeSubcommand

from vllm_omni.cpp.cli import add_cpp_args, apply_cpp_args
from vllm_omni.logger import init_logger

logger = init_logger(__name__)


def is_diffusers_pipeline(model: str) -> bool:
    return (Path(model) / "model_index.json").is_file()


class OmniServeCommand(ServeSubcommand):
    """vLLM's `serve` subcommand, extended with model-type detection for omni stage graphs."""

    def subparser_init(self, subparsers: argparse._SubParsersAction):
        parser = super().subparser_init(subparsers)
        parser.usage = "vllm-omni serve [model_tag] [options]   (or: vllm serve [model_tag] --omni)"
        add_cpp_args(parser)
        return parser

    def validate(self, args: argparse.Namespace) -> None:
        try:
            apply_cpp_args(args)
        except ValueError as e:
            raise SystemExit(f"vllm-omni serve: error: {e}") from None
        super().validate(args)

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        if is_diffusers_pipeline(args.model):
            raise SystemExit(
                f"vllm-omni serve: {args.model} is a diffusers pipeline; serving multi-stage "
                "pipelines is not available in this version. Serve an LM folder instead."
            )
        ServeSubcommand.cmd(args)
