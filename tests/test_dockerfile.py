# SPDX-License-Identifier: Apache-2.0
"""The Dockerfile cannot be built here (no container runtime): lint it, and check that it
installs this package on the vLLM this package pins."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pinned_vllm() -> str:
    """The version of the `cuda` extra's `vllm==X` pin in pyproject.toml."""
    found = re.search(r'"vllm==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert found, "pyproject.toml: no vllm==X pin"
    return found.group(1)


def _hadolint() -> str:
    # The venv's bin folder is on PATH only when it is activated.
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    assert found, "hadolint is missing: `make setup` installs it (the `test` extra)"
    return found


def test_hadolint_is_clean():
    result = subprocess.run(
        [_hadolint(), "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_is_stock_vllm_at_the_pinned_version():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^FROM vllm/vllm-openai:v{re.escape(_pinned_vllm())}$", text, re.M)
    assert 'ENTRYPOINT ["vllm", "serve"]' in text


def test_dockerignore_keeps_what_the_image_copies():
    copied = re.findall(r"^COPY (.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    kept = (ROOT / ".dockerignore").read_text()
    for line in copied:
        for source in line.split():
            assert f"!{source.rstrip('/')}" in kept.replace("/\n", "\n"), source
