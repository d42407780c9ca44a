# SPDX-License-Identifier: Apache-2.0
"""The session guard in tests/conftest.py: a leaked thread or process can't hold pytest's exit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LEAKY_TEST = """
import multiprocessing
import threading
import time


def test_leaks():
    threading.Thread(target=time.sleep, args=(600,), name="stuck-thread").start()
    multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,)).start()
    assert {outcome}
"""


@pytest.mark.parametrize("outcome, status", [(True, 0), (False, 1)], ids=["passes", "fails"])
def test_leaks_are_named_and_the_status_is_pytests(tmp_path: Path, outcome, status) -> None:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_leaky.py").write_text(LEAKY_TEST.format(outcome=outcome))
    # Without the guard, Python would wait 600 s for the thread before exiting.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == status, done.stdout + done.stderr
    assert "non-daemon threads alive after the tests: ['stuck-thread']" in done.stderr
    assert "processes alive after the tests, ended" in done.stderr
    assert "multiprocessing.spawn" in done.stderr
