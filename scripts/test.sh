#!/usr/bin/env bash
# Sets up .venv, then runs the linter, the formatter's check and the whole test suite (GPU tests skip
# themselves without CUDA; `bash scripts/gpu_test.sh` runs them on a GPU machine), and prints the 20 slowest
# tests. The suite runs in one pytest process per core, up to four (pytest-xdist), each module's tests in one
# of them, so that a module's engine or server starts once.
#
# Extra arguments go to pytest: `-m "not slow"` leaves out the tests that spawn processes, load the bundled
# model or run kernels in the Triton interpreter at large sizes; `-n 0` runs everything in one process;
# `-x`, `-k prefill`, a test file.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
# the linter and the formatter first: a tree they would change does not pass
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q --durations=20 -n auto --maxprocesses=4 --dist loadscope "$@"
