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

With the vocabulary split across tensor-parallel ranks, each rank scores its
own slice of token ids (`gumbel_max_keys`): chunks and noise counters stay
those of the whole vocabulary, so a token's score is the one a single rank
would give it, and the rank's best draw is written as one int64 key, the
score's order-preserving bits above the complement of the token id. The
largest key over the ranks (an all-reduce MAX) is then the draw of the whole
vocabulary, ties to the lower id (`ids_of_keys` reads it back).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from nanovllm.kernels.triton_pdl import compiled_for_gpu, pdl_launch, wait_for_previous_kernel

_BLOCK = 4096
_LOG2E = tl.constexpr(1.4426950408889634)
_ID_MASK = tl.constexpr(0xFFFFFFFF)  # a key's low 32 bits: the complement of its token id


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
    slice_start,
    slice_end,
    stride_row,
    NUM_CHUNKS: tl.constexpr,
    BLOCK: tl.constexpr,
    APPROX: tl.constexpr,
    HAS_THRESHOLDS: tl.constexpr,
    PDL: tl.constexpr,
):
    # the logits hold token ids slice_start .. slice_end - 1 of a `vocab`-wide vocabulary
    row = tl.program_id(0)
    program = tl.program_id(1)
    chunk = slice_start // BLOCK + program
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)  # token ids
    mask = (offsets >= slice_start) & (offsets < slice_end)
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    seed = tl.load(seeds_ptr + row)
    wait_for_previous_kernel(PDL)  # for the logits
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offsets - slice_start, mask=mask, other=0.0)
    x = x.to(tl.float32)
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
    tl.store(best_score_ptr + row * NUM_CHUNKS + program, tl.max(score, 0))
    tl.store(best_index_ptr + row * NUM_CHUNKS + program, chunk * BLOCK + best)


@triton.jit
def _best_chunk_kernel(
    best_score_ptr,
    best_index_ptr,
    out_ptr,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    AS_KEY: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    wait_for_previous_kernel(PDL)
    chunks = tl.arange(0, CHUNKS_PAD)
    scores = tl.load(best_score_ptr + row * NUM_CHUNKS + chunks, mask=chunks < NUM_CHUNKS, other=float("-inf"))
    best = tl.argmax(scores, 0)  # ties go to the lower chunk
    index = tl.load(best_index_ptr + row * NUM_CHUNKS + best)
    if AS_KEY:
        # a float's bits order as signed integers once a negative one's magnitude bits are flipped
        bits = tl.max(scores, 0).to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        tl.store(out_ptr + row, (ordered.to(tl.int64) << 32) | (_ID_MASK - index))
    else:
        tl.store(out_ptr + row, index)


@triton.jit
def _ids_of_keys_kernel(keys_ptr, out_ptr, rows, BLOCK: tl.constexpr, PDL: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    wait_for_previous_kernel(PDL)
    keys = tl.load(keys_ptr + offsets, mask=offsets < rows)
    tl.store(out_ptr + offsets, _ID_MASK - (keys & _ID_MASK), mask=offsets < rows)


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
    vocab = logits.size(1)
    return _draw(logits, temperatures, seeds, out, thresholds, 0, vocab, as_key=False)


def gumbel_max_keys(
    logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor, slice_start: int, vocab: int
) -> torch.Tensor:
    """Each row's best draw among token ids slice_start .. slice_start + logits.size(1) - 1 of a
    `vocab`-wide vocabulary, as an int64 key: the largest key over every slice is the draw
    `gumbel_max_sample` makes from the whole row (`ids_of_keys` gives its token id)."""
    # logits: [rows, slice]; temperatures: [rows]; seeds: [rows] int64 -> [rows] int64
    return _draw(logits, temperatures, seeds, None, None, slice_start, vocab, as_key=True)


def ids_of_keys(keys: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The token ids of draws' keys (`gumbel_max_keys`), written to `out`."""
    # keys, out: [rows] int64
    block = 256
    _ids_of_keys_kernel[(triton.cdiv(keys.numel(), block),)](
        keys, out, keys.numel(), BLOCK=block, **pdl_launch(keys.device)
    )
    return out


def _draw(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    out: torch.Tensor | None,
    thresholds: torch.Tensor | None,
    slice_start: int,
    vocab: int,
    as_key: bool,
) -> torch.Tensor:
    """Per row, the best draw over the logits of token ids slice_start onwards: its token id, or its key."""
    rows, width = logits.shape
    assert logits.stride(1) == 1
    block = min(_BLOCK, max(4, triton.next_power_of_2(vocab)))  # four logits per draw
    slice_end = slice_start + width
    num_chunks = triton.cdiv(slice_end, block) - slice_start // block
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
        slice_start,
        slice_end,
        logits.stride(0),
        NUM_CHUNKS=num_chunks,
        BLOCK=block,
        APPROX=compiled_for_gpu(logits.device),
        HAS_THRESHOLDS=thresholds is not None,
        **pdl,
    )
    _best_chunk_kernel[(rows,)](
        best_score,
        best_index,
        out,
        NUM_CHUNKS=num_chunks,
        CHUNKS_PAD=triton.next_power_of_2(num_chunks),
        AS_KEY=as_key,
        **pdl,
    )
    return out
