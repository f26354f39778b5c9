"""Triton kernel: grammar masks applied to logits in place.

A grammar mask is a packed bitmask per sampling row: bit j of int32 word w
allows token 32 w + j. The rows a grammar holds get their forbidden logits set
to -inf; other rows, and tokens past the mask's 32 x words, are left as they
are. Layout: logits [rows, vocab] (last dim contiguous, any float dtype);
bitmask [rows, words] int32, a row per logits row; masked_rows [n] int32, the
rows to apply. Grid (n, cdiv(vocab, BLOCK)): a program reads BLOCK / 32 words
of one row's mask and writes -inf over the logits they forbid. Every engine
launch has the same vocabulary and strides, so the one variant the engine's
warm-up compiles serves every step, whatever the number of rows.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 4096


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    masked_rows_ptr,
    vocab,
    logits_stride,
    bitmask_stride,
    BLOCK: tl.constexpr,
):
    row = tl.load(masked_rows_ptr + tl.program_id(0)).to(tl.int64)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = offsets < vocab
    words = tl.load(bitmask_ptr + row * bitmask_stride + offsets // 32, mask=in_vocab, other=-1)
    forbidden = in_vocab & (((words >> (offsets % 32)) & 1) == 0)
    tl.store(logits_ptr + row * logits_stride + offsets, float("-inf"), mask=forbidden)


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, masked_rows: torch.Tensor) -> None:
    """Set to -inf, in place, the logits of `masked_rows` that their bitmask rows forbid."""
    # logits: [rows, vocab]; bitmask: [rows, words] int32; masked_rows: [n] int32, on the logits' device
    assert logits.stride(1) == 1 and bitmask.stride(1) == 1 and bitmask.dtype == torch.int32
    vocab = min(logits.size(1), bitmask.size(1) * 32)
    grid = (masked_rows.numel(), triton.cdiv(vocab, _BLOCK))
    _apply_bitmask_kernel[grid](logits, bitmask, masked_rows, vocab, logits.stride(0), bitmask.stride(0), BLOCK=_BLOCK)
