#!/usr/bin/env bash
# Downloads into .whl/ the wheels that the GPU test run (scripts/gpu_test.sh) installs on a GPU machine that
# cannot reach a package index: nanovllm's dependencies and test extras that a CUDA image with PyTorch, Triton,
# transformers and pytest lacks, for CPython 3.12 on x86-64 Linux, at the versions .venv holds (so the GPU run
# uses what the CPU suite was run with). Needs .venv (scripts/setup.sh) and a reachable package index.
# Usage: bash scripts/gpu_wheels.sh [PYTHON_VERSION]   (default 3.12, the GPU image's)
set -euo pipefail
cd "$(dirname "$0")/.."
python_version="${1:-3.12}"
# what the test modules import (at collection, every module is imported) and what those packages need
names=(
    fastapi starlette pydantic pydantic-core annotated-types annotated-doc typing-inspection opentelemetry-api
    uvicorn httptools msgspec pyzmq openai httpx2 httpcore2 truststore jiter sniffio anyio idna h11
    typing-extensions jsonschema jsonschema-specifications referencing rpds-py attrs xgrammar apache-tvm-ffi
)
installed="$(.venv/bin/python -m pip list --disable-pip-version-check --format=freeze)"
pins=()
for name in "${names[@]}"; do
    # pip lists names with '-' or '_' as their projects spell them
    pin="$(grep -i "^${name//-/[-_]}==" <<<"$installed" || true)"
    if [ -z "$pin" ]; then
        echo "$name is not installed in .venv: run 'bash scripts/setup.sh test' first" >&2
        exit 1
    fi
    pins+=("$pin")
done
platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28; do
    platforms+=(--platform "${tag}_x86_64")
done
rm -rf .whl
.venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$python_version" --implementation cp "${platforms[@]}" -d .whl "${pins[@]}"
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/"
