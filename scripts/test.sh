#!/usr/bin/env bash
# Sets up .venv and runs the test suite (GPU tests skip themselves without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/python -m pytest -q "$@"
