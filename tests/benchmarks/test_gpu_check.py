# SPDX-License-Identifier: Apache-2.0
"""benchmarks/gpu_check.py's dry run: the script meant for a GPU machine without vLLM runs its
whole path on CPU at tiny shapes, with vLLM hidden from it (a subprocess: the script blocks
vLLM imports process-wide)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_measures_every_part_without_vllm(tmp_path):
    out, md = tmp_path / "gpu_check.json", tmp_path / "gpu_check.md"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--dry-run",
            "--json",
            str(out),
            "--md",
            str(md),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["provenance"]["dtype"] == "float32"

    dit = report["dit"]
    assert "skipped" not in dit
    assert dit["finite"]
    # float32 on CPU: the step-batched stage reproduces diffusers' one-request calls.
    assert dit["latent_rel_l2_vs_diffusers_max"] < 1e-4
    assert dit["stage_s"] > 0 and dit["diffusers_sequential_s"] > 0

    profile = report["layer_profile"]
    measured = [row for row in profile["rows"] if "seconds" in row]
    assert len(measured) == profile["fit_samples"] == 9
    assert profile["fit_per_layer"]["unit"] == "s"

    projection = report["projection"]
    assert {r["pp"] for r in projection} == {4, 8}
    for row in projection:
        assert row["cpp_chunks"] >= 1 and row["fixed_ttft_s"] > 0 and row["cpp_ttft_s"] > 0
    assert "CPP projection" in md.read_text()
