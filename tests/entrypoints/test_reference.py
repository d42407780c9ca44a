# SPDX-License-Identifier: Apache-2.0
"""docs/configuration.md is what the code says: regenerate it when a flag or a field changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.entrypoints.cli import reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_reference_is_current() -> None:
    assert DOC.read_text() == reference.render(), (
        "docs/configuration.md is stale: python -m vllm_omni.entrypoints.cli.reference "
        "> docs/configuration.md"
    )


def test_every_flag_and_field_is_documented() -> None:
    text = reference.render()
    for flag in ("--cpp", "--stage-configs", "--dit-cache", "--max-request-steps"):
        assert f"`{flag}`" in text
    for field in ("stream_input", "resources", "scheduling_policy", "max_consecutive"):
        assert f"| `{field}` |" in text

    from dataclasses import dataclass

    @dataclass
    class Undocumented:
        size: int = 1

    with pytest.raises(ValueError, match=r"Undocumented: fields without a docstring: \['size'\]"):
        reference.field_table(Undocumented, "x")
