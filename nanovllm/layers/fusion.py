"""Fusing chains of small element-wise ops into one kernel each with torch.compile, on CUDA only."""

import functools
from collections.abc import Callable

import torch


def fused_on_cuda(fn: Callable) -> Callable:
    """`fn` compiled by torch.compile (one generated kernel) when its first argument is on CUDA, eager elsewhere.

    The CPU path stays eager: compiling there needs a C++ toolchain and buys little.
    Compilation happens at the first CUDA call, before CUDA graphs are captured.
    """
    compiled = torch.compile(fn, dynamic=True)

    @functools.wraps(fn)
    def dispatch(x: torch.Tensor, *args):
        return compiled(x, *args) if x.is_cuda else fn(x, *args)

    return dispatch
