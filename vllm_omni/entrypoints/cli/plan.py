# SPDX-License-Identifier: Apache-2.0
"""`vllm-omni plan MODEL`: each stage's memory at real sizes and a placement that fits.

    vllm-omni plan Qwen/Qwen2.5-Omni-7B --device-memory 24GiB
    vllm-omni plan Qwen/Qwen-Image --num-devices 2 --json plan.json

Reads the model's config files only (a hub repo's `*.json`; no weights), builds each stage's
modules on the meta device and prints per stage its parameters, weight, KV-cache and activation
bytes, its device and, for AR stages, the `gpu_memory_utilization` to start it with
(vllm_omni.engine.memory_plan). Exits 1 with one line naming the stage that does not fit.
"""

from __future__ import annotations

import argparse

from vllm_omni.engine.memory_plan import DEFAULT_NUM_SEQS, DTYPES, parse_bytes

CONFIG_PATTERNS = ["*.json"]  # configs of every component; no weights


class PlanCommand:
    name = "plan"

    @staticmethod
    def cmd(args: argparse.Namespace) -> None:
        from vllm_omni.config.model_defaults import resolve_stage_graph
        from vllm_omni.config.model_source import model_path
        from vllm_omni.engine.memory_plan import plan_memory

        try:
            folder = model_path(
                args.model,
                revision=args.revision,
                download_dir=args.download_dir,
                allow_patterns=CONFIG_PATTERNS,
            )
            graph = resolve_stage_graph(folder, args.stage_configs)
            plan = plan_memory(
                args.model,
                graph,
                dtype=args.dtype,
                device_memory=parse_bytes(args.device_memory),
                num_devices=args.num_devices,
                max_model_len=args.max_model_len,
                max_num_seqs=args.max_num_seqs,
            )
        except ValueError as e:
            raise SystemExit(f"vllm-omni plan: error: {e}") from None
        print(plan.table())
        if args.json:
            plan.write_json(args.json)

    def validate(self, args: argparse.Namespace) -> None:
        pass

    def subparser_init(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(
            self.name,
            help="per-stage memory of a model at real sizes, and a placement that fits",
            description=__doc__.split("\n\n")[0],
            usage="vllm-omni plan MODEL [options]",
        )
        parser.add_argument("model", help="a model folder or Hugging Face hub repo id")
        parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
        parser.add_argument(
            "--device-memory", default="80GiB", help="memory of one device (default: 80GiB)"
        )
        parser.add_argument("--num-devices", type=int, default=1)
        parser.add_argument(
            "--max-model-len",
            type=int,
            default=None,
            help="context of the AR stages that set none (default: the model's)",
        )
        parser.add_argument(
            "--max-num-seqs",
            type=int,
            default=DEFAULT_NUM_SEQS,
            help="full-length sequences each AR stage's KV cache must hold at least "
            f"(default {DEFAULT_NUM_SEQS}: what vLLM needs to start; the plan gives each the "
            "memory left over on top)",
        )
        parser.add_argument("--stage-configs", default=None, help="a stage graph YAML")
        parser.add_argument("--revision", default=None)
        parser.add_argument("--download-dir", default=None)
        parser.add_argument("--json", default=None, metavar="PATH", help="write the plan as JSON")
        return parser
