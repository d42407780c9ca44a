# SPDX-License-Identifier: Apache-2.0
"""The `vllm-omni` command (`serve`, `plan`), also reached through vLLM's own hand-off:
`vllm serve MODEL --omni`.

vLLM's CLI calls `main()` when `--omni` is on its command line (before it parses anything), with
`sys.argv` as the user typed it; `vllm-omni serve MODEL` arrives here the same way.
"""

from __future__ import annotations

import sys

OMNI_FLAG = "--omni"


def main(argv: list[str] | None = None) -> None:
    import vllm
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm_omni
    from vllm_omni.entrypoints.cli.plan import PlanCommand
    from vllm_omni.entrypoints.cli.serve import OmniServeCommand

    argv = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg != OMNI_FLAG]
    cli_env_setup()

    parser = FlexibleArgumentParser(
        prog="vllm-omni",
        description="vLLM with chunked pipeline parallelism (--cpp) and multi-stage omni models.",
    )
    parser.add_argument(
        "-v",
        "--version",
        action="version",
        version=f"vllm-omni {vllm_omni.__version__} (vLLM {vllm.__version__})",
    )
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    commands = [OmniServeCommand(), PlanCommand()]
    for command in commands:
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args(argv)
    configure_logging_from_args(args)
    for command in commands:
        if args.subparser == command.name:
            command.validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
