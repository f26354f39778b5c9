#!/usr/bin/env bash
# Sets up .venv and runs the demo: chat prompts answered by SmolLM2-135M-Instruct on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
.venv/bin/python examples/demo.py "$@"
