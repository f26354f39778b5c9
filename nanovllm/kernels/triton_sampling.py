"""Triton kernels: temperature sampling by Gumbel-max, reading each logit once.

argmax(softmax(x / T) / E) with E ~ Exp(1) equals argmax(x / T + G) with
G = -log(-log(U)) Gumbel noise, so no softmax pass is needed. Rows with T = 0
take the plain argmax and draw no noise. Scores are kept in base 2,
x * log2(e) / T - log2(-log2(U)) (the constant log2(ln 2) dropped), so that on
a GPU both logarithms are the one-instruction approximation, and each Philox
call gives four uniforms (`tl.rand4x`) for four logits: with a draw per logit
and exact logarithms the noise, not the logits' bytes, would bound the kernel.

Layout: logits [rows, vocab] (any float dtype, last dim contiguous),
temperatures [rows] (fp32, or fp64 from the decode buffers), seeds [rows]
int64. Grid (rows, chunks): a program scores BLOCK (4096, or the vocabulary if
smaller) logits of one row and keeps its best (score, index). Then grid
(rows,): a program picks its row's best chunk (ties go to the lower index,
like torch.argmax) and writes the token id.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from nanovllm.kernels.triton_pdl import compiled_for_gpu, pdl_launch, wait_for_previous_kernel

_BLOCK = 4096
_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _log2(x, APPROX: tl.constexpr):
    """log2(x): on a GPU the approximation (relative error about 2^-22, immaterial for noise), the exact
    function under the interpreter, which has no approximation."""
    if APPROX:
        return libdevice.fast_log2f(x)
    return tl.log2(x)


@triton.jit
def _gumbel_max_chunk_kernel(
    logits_ptr,
    temperatures_ptr,
    seeds_ptr,
    thresholds_ptr,
    best_score_ptr,
    best_index_ptr,
    vocab,
    stride_row,
    NUM_CHUNKS: tl.constexpr,
    BLOCK: tl.constexpr,
    APPROX: tl.constexpr,
    HAS_THRESHOLDS: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < vocab
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    seed = tl.load(seeds_ptr + row)
    wait_for_previous_kernel(PDL)  # for the logits
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_THRESHOLDS:  # truncation: only logits at or above the row's threshold may be drawn
        x = tl.where(x >= tl.load(thresholds_ptr + row), x, float("-inf"))
    score = x
    if temperature > 0:  # greedy rows draw no noise
        # u: [BLOCK], the four draws of counter c go to logits 4c .. 4c + 3 of the chunk
        u0, u1, u2, u3 = tl.rand4x(seed, row * vocab + chunk * BLOCK + tl.arange(0, BLOCK // 4))
        u = tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), [BLOCK])
        score = x * (_LOG2E / temperature) - _log2(-_log2(u, APPROX), APPROX)
    # NaN ranks highest, as in torch.argmax; left as NaN, the reduction could
    # settle on a masked lane past the vocabulary
    score = tl.where(score != score, float("inf"), score)
    score = tl.where(mask, score, float("-inf"))
    best = tl.argmax(score, 0)
    tl.store(best_score_ptr + row * NUM_CHUNKS + chunk, tl.max(score, 0))
    tl.store(best_index_ptr + row * NUM_CHUNKS + chunk, chunk * BLOCK + best)


@triton.jit
def _best_chunk_kernel(
    best_score_ptr, best_index_ptr, out_ptr, NUM_CHUNKS: tl.constexpr, CHUNKS_PAD: tl.constexpr, PDL: tl.constexpr
):
    row = tl.program_id(0)
    wait_for_previous_kernel(PDL)
    chunks = tl.arange(0, CHUNKS_PAD)
    scores = tl.load(best_score_ptr + row * NUM_CHUNKS + chunks, mask=chunks < NUM_CHUNKS, other=float("-inf"))
    best = tl.argmax(scores, 0)  # ties go to the lower chunk
    tl.store(out_ptr + row, tl.load(best_index_ptr + row * NUM_CHUNKS + best))


def gumbel_max_sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    out: torch.Tensor | None = None,
    thresholds: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per row: argmax where the temperature is 0, else a draw from softmax(logits / T)
    with noise from the row's seed, among the logits at or above the row's threshold when
    `thresholds` are given (`truncation_thresholds`); written to `out` when given. The seeds are read
    on the device, so a CUDA graph draws afresh at each replay when its seeds are refilled."""
    # logits: [rows, vocab]; temperatures: [rows] (any float dtype); seeds: [rows] int64;
    # thresholds: [rows] float32 -> [rows] int64
    rows, vocab = logits.shape
    assert logits.stride(1) == 1
    block = min(_BLOCK, max(4, triton.next_power_of_2(vocab)))  # four logits per draw
    num_chunks = triton.cdiv(vocab, block)
    best_score = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    best_index = torch.empty(rows, num_chunks, dtype=torch.int64, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device) if out is None else out
    pdl = pdl_launch(logits.device)
    _gumbel_max_chunk_kernel[(rows, num_chunks)](
        logits,
        temperatures,
        seeds,
        thresholds,
        best_score,
        best_index,
        vocab,
        logits.stride(0),
        NUM_CHUNKS=num_chunks,
        BLOCK=block,
        APPROX=compiled_for_gpu(logits.device),
        HAS_THRESHOLDS=thresholds is not None,
        **pdl,
    )
    _best_chunk_kernel[(rows,)](
        best_score, best_index, out, NUM_CHUNKS=num_chunks, CHUNKS_PAD=triton.next_power_of_2(num_chunks), **pdl
    )
    return out
