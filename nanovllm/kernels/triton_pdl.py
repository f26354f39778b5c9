"""Programmatic dependent launch: a decode kernel starts while the kernel before it finishes.

A one-sequence decode step is a chain of some two hundred small kernels, each
of which reads its weights and then waits on the one before it only for a
vector. Launched with `launch_pdl=True` (Hopper and later), a kernel's
programs may be placed on the SMs while the previous kernel's last programs
still run: they issue the loads that depend on no earlier kernel (weights),
then `wait_for_previous_kernel`, which returns once that kernel has finished
and its writes are visible, and lets the next kernel in turn be placed. A
kernel launched this way must call it before any other load or store.
"""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@functools.cache
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` are launched with programmatic dependent launch."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1" and _supported(device.index)


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """Wait until the previous kernel has finished and its writes are visible, then let the next
    kernel's programs start (a no-op without PDL)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
