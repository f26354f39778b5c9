"""Programmatic dependent launch: a decode kernel starts while the kernel before it finishes.

A one-sequence decode step is a chain of some two hundred small kernels, each
of which reads its weights and then waits on the one before it only for a
vector. Launched with `launch_pdl=True` (Hopper and later), a kernel's
programs may be placed on the SMs while the previous kernel's last programs
still run: they issue the loads that depend on no earlier kernel (weights),
then `wait_for_previous_kernel`, which returns once that kernel has finished
and its writes are visible, and lets the next kernel in turn be placed. A
kernel launched this way must call it before any other load or store; `pdl_launch`
gives the launch options that keep the two together.

A kernel may instead let the next one be placed later, after its main loop
(`wait_for_previous_kernel(PDL, False)`, then `let_next_kernel_start`). The
products of a few rows (`triton_gemv._rows_kernel`) do: placed while they still
stream W, the next kernel's programs would hold SMs (and their shared memory)
only to wait. The one-row product and the merge of attention slices let the
next kernel start at once: for them the later start makes the decode step slower.
"""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def compiled_for_gpu(device: torch.device) -> bool:
    """Whether kernels on `device` run compiled for a GPU, not in the Triton interpreter."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"


@functools.cache
def pdl_launch(device: torch.device) -> dict:
    """A kernel launch's PDL options on `device`: the kernel's PDL constexpr and the launch flag,
    always equal, since a kernel launched early must also wait. Programmatic dependent launch needs
    Hopper or later, and is off in the Triton interpreter."""
    enabled = compiled_for_gpu(device) and torch.cuda.get_device_capability(device) >= (9, 0)
    return {"PDL": enabled, "launch_pdl": enabled}


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr, LET_NEXT_START: tl.constexpr = True):
    """Wait until the previous kernel has finished and its writes are visible, then, unless
    LET_NEXT_START is off, let the next kernel's programs start (a no-op without PDL)."""
    if PDL:
        gdc_wait()
        if LET_NEXT_START:
            gdc_launch_dependents()


@triton.jit
def let_next_kernel_start(PDL: tl.constexpr):
    """Let the next kernel's programs start, in a kernel that waited with LET_NEXT_START off (a no-op
    without PDL)."""
    if PDL:
        gdc_launch_dependents()
