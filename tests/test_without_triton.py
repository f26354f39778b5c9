"""The demo's install has no Triton (PyTorch's CPU build does not bring it): every module outside kernels/
imports without it, so that the Triton kernels (and the optional flash-attn) are imported only where CUDA runs
them."""

import pkgutil
import subprocess
import sys

import nanovllm

_IMPORT_ALL_WITHOUT_TRITON = """
import importlib, sys
sys.modules["triton"] = None  # `import triton` now raises ImportError
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def test_every_module_outside_the_kernels_imports_without_triton():
    names = [
        module.name
        for module in pkgutil.walk_packages(nanovllm.__path__, "nanovllm.")
        if not module.name.startswith("nanovllm.kernels.")
    ]
    assert "nanovllm.layers.gated_delta_net" in names
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL_WITHOUT_TRITON, *names], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
