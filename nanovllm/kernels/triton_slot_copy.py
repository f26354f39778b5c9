"""Copies between state slots on the GPU: each (source, destination) pair's row of every layer read once and
written once (a source of -1: zeros), one launch per state tensor.

`StateCache.copy_states` in PyTorch gathers the sources into a new tensor, zeroes the rows of -1 sources and
scatters it: three passes over the states copied, each both read and written, where this is one. It matters
because a state is large (a Qwen3.5-9B sequence's is 51 MB) and decode steps snapshot one sequence in every
block size of them.

The pairs' slots must be distinct from one another's (no destination is also a source): programs run in no
order, so a destination written before another program read it as a source would lose its old states.
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096  # values a program copies: a state row of a few hundred KB is many programs


@triton.jit
def _slot_copy_kernel(t_ptr, pairs_ptr, row, stride_layer, stride_slot, BLOCK: tl.constexpr):
    pair, layer, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    source = tl.load(pairs_ptr + 2 * pair)
    destination = tl.load(pairs_ptr + 2 * pair + 1)
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = offsets < row
    base = t_ptr + layer.to(tl.int64) * stride_layer
    values = tl.load(base + tl.maximum(source, 0) * stride_slot + offsets, mask=valid & (source >= 0), other=0)
    tl.store(base + destination * stride_slot + offsets, values, mask=valid)


def copy_slots(t: torch.Tensor, pairs: torch.Tensor) -> None:
    """For each row (source, destination) of `pairs`, t[:, destination] = t[:, source] (zeros for a source
    of -1), in place; the pairs' slots distinct from one another's.

    t: [layers, slots, *state shape], each (layer, slot) row contiguous; pairs: [n, 2] int64 on t's device
    """
    layers, num_pairs = t.size(0), pairs.size(0)
    row = t[0, 0].numel()
    assert t[0, 0].is_contiguous() and t.stride(1) == row and pairs.is_contiguous()
    if num_pairs:
        _slot_copy_kernel[(num_pairs, layers, triton.cdiv(row, BLOCK))](
            t, pairs, row, t.stride(0), t.stride(1), BLOCK=BLOCK
        )
