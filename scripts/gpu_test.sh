#!/usr/bin/env bash
# Runs every GPU test (marker `gpu`) on this machine's CUDA GPU: first all but the `whole_gpu` ones, spread over
# parallel pytest processes (pytest-xdist), since most of a cold run is Triton compiling kernels, one CPU core
# per compile; then the `whole_gpu` ones, which size from or measure the whole GPU's memory, alone in one
# process. Extra arguments go to both pytest runs (e.g. `-x`, `-k prefill`); GPU_TEST_WORKERS sets the number
# of processes (default: the CPU cores, at most 16). Prints the 20 slowest tests of each run, then the counts
# of both together and the wall time.
#
# Expects: a CUDA GPU, and a Python (.venv/bin/python if present, else python3; or $PYTHON) with PyTorch,
# Triton, transformers, pytest and pytest-xdist. Where nanovllm's other dependencies and test extras are
# missing and no package index can be reached, put their wheels in .whl/ first (`bash scripts/gpu_wheels.sh`
# on a machine with one): this script installs them into a temporary folder and puts it on PYTHONPATH.
#
# Triton keeps compiled kernels in $TRITON_CACHE_DIR (default .triton-cache/ here, ignored by git) and
# torch.compile in $TORCHINDUCTOR_CACHE_DIR (default .inductor-cache/): a second run on the same machine
# compiles nothing again.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    site="${TMPDIR:-/tmp}/nanovllm-gpu-site"
    rm -rf "$site"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --target "$site" .whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.triton-cache}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/.inductor-cache}"
# every core already runs a test process: torch.compile compiles in that process rather than in a pool of its own
export TORCHINDUCTOR_COMPILE_THREADS=1

"$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || {
    echo "no CUDA GPU is visible to $PYTHON: the GPU tests would all skip" >&2
    exit 1
}
"$PYTHON" -c "import xdist" 2>/dev/null || {
    echo "pytest-xdist is missing: $PYTHON -m pip install pytest-xdist (or put its wheel and execnet's in .whl/)" >&2
    exit 1
}
workers="${GPU_TEST_WORKERS:-$(nproc)}"
[ "$workers" -gt 16 ] && workers=16
# PyTorch's CPU work (the transformers references) gets the cores left per process: more threads than cores
# spin waiting on each other and slow the compiles beside them
threads=$(($(nproc) / workers))
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$((threads > 0 ? threads : 1))}"

reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT
status=0
# worksteal: a process that runs out of tests takes some of another's, so the engine tests (the slowest)
# do not leave one process working alone at the end
"$PYTHON" -m pytest -m "gpu and not whole_gpu" -n "$workers" --dist worksteal --durations=20 -q -rfEs \
    --junitxml="$reports/parallel.xml" "$@" || status=$?
"$PYTHON" -m pytest -m "gpu and whole_gpu" --durations=20 -q -rfEs --junitxml="$reports/alone.xml" "$@" || {
    code=$?
    # 5: no test selected (e.g. by -k)
    [ "$code" -eq 5 ] || status=$code
}
"$PYTHON" - "$reports"/*.xml <<'EOF'
import os
import sys
import xml.etree.ElementTree as ET

totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
for path in sys.argv[1:]:
    if not os.path.exists(path):  # a run that stopped before writing its report
        continue
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
print(f"GPU suite: {passed} passed, {totals['failures']} failed, {totals['errors']} errors, "
      f"{totals['skipped']} skipped", end="")
EOF
echo ", $(($(date +%s) - start)) s wall ($workers processes), exit status $status"
exit "$status"
