# SPDX-License-Identifier: Apache-2.0
"""benchmarks.common: the provenance every result file carries, and the paired statistics."""

import ast
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.common import alternate, geomean, paired_ratio, percentile, write_result
from benchmarks.common.provenance import provenance

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_result_file_carries_its_provenance(tmp_path):
    path = tmp_path / "sub" / "result.json"
    returned = write_result(path, {"speedup": 1.5}, dtype="float32")
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(returned))
    assert written["speedup"] == 1.5
    p = written["provenance"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=BENCHMARKS, capture_output=True, text=True
    ).stdout.strip()
    assert p["commit"] == head and p["dirty"] == bool(p["changed"])
    assert p["cpu"]["model"] and p["cpu"]["cores"] >= 1 and isinstance(p["cpu"]["flags"], list)
    for library in ("python", "torch", "vllm", "diffusers", "transformers"):
        assert library in p["libraries"]
    assert p["libraries"]["python"] and p["libraries"]["torch"]
    assert p["dtype"] == "float32"
    assert isinstance(p["argv"], list) and p["utc"].endswith("+00:00")


def test_provenance_is_the_writers_to_fill():
    with pytest.raises(ValueError, match="provenance"):
        write_result(None, {"provenance": {}})
    assert provenance(argv=["x", "--json", "y"])["argv"] == ["x", "--json", "y"]


def _json_flag_and_writer(tree: ast.Module) -> tuple[bool, bool]:
    flag = writer = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "--json":
            flag = True
        if isinstance(node, ast.Name) and node.id == "write_result":
            writer = True
    return flag, writer


def test_every_benchmark_with_json_output_writes_through_write_result():
    scripts = sorted(BENCHMARKS.glob("*.py"))
    with_json = []
    for script in scripts:
        tree = ast.parse(script.read_text())
        flag, writer = _json_flag_and_writer(tree)
        if flag:
            with_json.append(script.name)
            assert writer, f"{script.name} has --json but does not write it with write_result"
            source = script.read_text()
            assert "sys.path" not in source, f"{script.name}: import benchmarks.* instead"
    assert len(with_json) >= 14


def test_percentile_is_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 5.0
    with pytest.raises(ValueError, match="q"):
        percentile(values, 101)


def test_paired_ratios():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    r = paired_ratio([2.0, 4.0, 9.0], [1.0, 1.0, 3.0])
    assert r["median"] == 3.0 and r["geomean"] == pytest.approx(24 ** (1 / 3)) and r["pairs"] == 3
    with pytest.raises(ValueError, match="numerators"):
        paired_ratio([1.0], [1.0, 2.0])


def test_alternate_swaps_which_arm_goes_first():
    order = []
    arms = {name: (lambda name=name: order.append(name) or len(order)) for name in ("a", "b")}
    runs = alternate(arms, 3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert runs == {"a": [1, 4, 5], "b": [2, 3, 6]}
