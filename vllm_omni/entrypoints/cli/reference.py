# SPDX-License-Identifier: Apache-2.0
"""docs/configuration.md, written from the code: every flag the project adds to `vllm serve`
(from the argparse groups) and every field of a stage-graph YAML (from the config dataclasses
and their field docstrings), so the reference cannot go stale.

    python -m vllm_omni.entrypoints.cli.reference > docs/configuration.md

tests/entrypoints/test_reference.py fails when the file differs from what this writes.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import textwrap
import typing

HEADER = """\
# Configuration reference

Written by `python -m vllm_omni.entrypoints.cli.reference` from the argument parser and the
config dataclasses; a test fails when this file differs from what it writes. vLLM's own flags
(`vllm serve --help`) apply as well: those that make sense for a stage graph's AR stages
(`--dtype`, `--max-model-len`, `--enforce-eager`, `-pp`, `--gpu-memory-utilization`) are passed
on to them.
"""


def _own_groups(parser: argparse.ArgumentParser) -> list[argparse._ArgumentGroup]:
    """The argument groups this project adds to vLLM's `serve` parser."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    stock = ServeSubcommand().subparser_init(FlexibleArgumentParser(prog="vllm").add_subparsers())
    known = {g.title for g in stock._action_groups}
    return [g for g in parser._action_groups if g.title not in known and g._group_actions]


def _flag_rows(group: argparse._ArgumentGroup) -> list[str]:
    rows = []
    for action in group._group_actions:
        flags = ", ".join(f"`{o}`" for o in action.option_strings)
        if isinstance(action, argparse._StoreTrueAction):
            default = "off"
        elif action.default is None:
            default = "-"
        else:
            default = f"`{action.default}`"
        text = " ".join((action.help or "").split()).rstrip(".")
        if action.choices:
            text += f"; one of {', '.join(f'`{c}`' for c in action.choices)}"
        rows.append(f"| {flags} | {default} | {_cell(text)}. |")
    return rows


def serve_flags() -> str:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_omni.entrypoints.cli.serve import OmniServeCommand

    parser = OmniServeCommand().subparser_init(
        FlexibleArgumentParser(prog="vllm-omni").add_subparsers()
    )
    out = ["## `vllm serve M --omni` (or `vllm-omni serve M`)", ""]
    for group in _own_groups(parser):
        out += [f"### {group.title}", ""]
        if group.description:
            out += [" ".join(group.description.split()), ""]
        out += ["| flag | default | meaning |", "|---|---|---|", *_flag_rows(group), ""]
    return "\n".join(out)


def field_docs(cls: type) -> dict[str, str]:
    """A dataclass's field docstrings: the string right after each field's annotation."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _cell(text: str) -> str:
    """Text for a markdown table cell."""
    return text.replace("|", "\\|")


def _type_name(annotation: object) -> str:
    text = annotation if isinstance(annotation, str) else typing._type_repr(annotation)
    return text.replace("typing.", "").replace("collections.abc.", "")


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`" if field.default is not None else "-"
    if field.default_factory is not dataclasses.MISSING:
        return f"`{field.default_factory()!r}`"
    return "required"


def field_table(cls: type, where: str) -> str:
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
    if missing:
        raise ValueError(f"{cls.__name__}: fields without a docstring: {missing}")
    rows = [
        f"| `{f.name}` | `{_cell(_type_name(f.type))}` | {_default(f)} | {_cell(docs[f.name])} |"
        for f in dataclasses.fields(cls)
        if f.name not in ("model",) or cls.__name__ == "StageConfig"
    ]
    head = [f"### {where}", "", "| field | type | default | meaning |", "|---|---|---|---|"]
    return "\n".join(head + rows) + "\n"


def graph_fields() -> str:
    from vllm_omni.config.stage_config import StageConfig, StageGraph
    from vllm_omni.diffusion.config import DiTConfig
    from vllm_omni.diffusion.residual_cache import ResidualCacheConfig

    return "\n".join(
        [
            "## Stage-graph YAML (`--stage-configs`, `OmniLLM(stage_configs=...)`)",
            "",
            "Every field is checked when the graph loads; an error names it "
            "(`stages[1].dit.max_num_seqs: must be an integer >= 1`). docs/stage_graphs.md shows "
            "graphs.",
            "",
            field_table(StageGraph, "the graph"),
            field_table(StageConfig, "`stages[i]`"),
            field_table(DiTConfig, "`stages[i].dit` (DiT stages)"),
            field_table(ResidualCacheConfig, "`stages[i].dit.residual_cache`"),
        ]
    )


def render() -> str:
    return "\n".join([HEADER, serve_flags(), graph_fields()]).rstrip() + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
