#!/usr/bin/env bash
# Sets up .venv and runs the test suite (GPU tests skip themselves without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
# the linter and the formatter first: a tree they would change does not pass
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q "$@"
