"""Triton kernels: each row's truncation threshold for min-p, top-k and top-p, found without a sort.

Every truncation keeps an upper set of a row's logits, so one number says what
a row keeps: its smallest kept logit, the threshold. The sampler then draws
only among logits at or above it (`gumbel_max_sample(..., thresholds)`).

- min-p keeps x >= m + T ln(min_p) (m the row's largest logit): that is a count
  of logits, c, so min-p and top-k together keep the top min(k, c) logits.
- top-k's threshold is the largest logit value t with count(x >= t) >= k
  (logits tied with it are kept).
- top-p, applied after them as vLLM does, is the largest value t with
  mass(x >= t) >= p * mass(x >= the top-k threshold), where mass sums
  exp((x - m) / T).

Both are found by the same search, over an order-preserving integer key of
each logit (the float's bits, negative ones flipped, less the low bits that
the logits' dtype leaves zero: 16 bits for bf16), so the answer is exact. A
row keeps an interval [lo, hi) of keys with f(lo) >= target > f(hi); each pass
reads the row once and totals f at `_PIVOTS` keys spread over the interval,
then narrows it to the two neighbouring pivots: 17 times narrower per pass, 4
passes for bf16 keys. A row whose interval is down to one key reads nothing.
The number of passes is fixed by the dtype, so a CUDA graph captures them.

Layout: logits [rows, vocab] (last dim contiguous); temperatures [rows] (0 =
greedy: no truncation), top_k [rows] int64 (>= vocab: off), top_p [rows]
float32 (1: off), min_p [rows] float32 (0: off). Grid (rows, chunks) for the
passes over the logits, each program `_BLOCK` logits of one row; grid (rows,)
for the steps that combine a row's chunks.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 1024
_PIVOTS = 16
_LOG2E = tl.constexpr(1.4426950408889634)
# low bits of a float32's pattern that are always zero for values of each dtype
_ZERO_BITS = {torch.bfloat16: 16, torch.float16: 13, torch.float32: 0}
_KEY_BITS = {torch.bfloat16: 16, torch.float16: 19, torch.float32: 32}


@triton.jit
def _order_key(x, ZERO_BITS: tl.constexpr):
    """An int64 that orders as the float32 `x` does (negative patterns flipped), less its always-zero bits."""
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (key >> ZERO_BITS).to(tl.int64)


@triton.jit
def _key_value(key, ZERO_BITS: tl.constexpr):
    """The float32 whose `_order_key` is `key`."""
    key32 = key.to(tl.int32)
    low = tl.where(key32 < 0, (1 << ZERO_BITS) - 1, 0)  # a negative pattern's flipped zero bits
    full = (key32 << ZERO_BITS) | low
    bits = full ^ ((full >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load_row_chunk(logits_ptr, row, chunk, vocab, stride_row, BLOCK: tl.constexpr):
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offsets, mask=mask, other=float("-inf"))
    return x.to(tl.float32), mask


@triton.jit
def _chunk_stats_kernel(
    logits_ptr,
    temperatures_ptr,
    max_ptr,
    sum_ptr,
    min_key_ptr,
    vocab,
    stride_row,
    NUM_CHUNKS: tl.constexpr,
    ZERO_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # max, sum, min_key: [rows, chunks]: the chunk's largest logit, its sum of exp((x - that) / T), its least key
    row, chunk = tl.program_id(0), tl.program_id(1)
    x, mask = _load_row_chunk(logits_ptr, row, chunk, vocab, stride_row, BLOCK)
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    scale = tl.where(temperature > 0, _LOG2E / temperature, 0.0)
    chunk_max = tl.max(x, 0)
    slot = row * NUM_CHUNKS + chunk
    tl.store(max_ptr + slot, chunk_max)
    tl.store(sum_ptr + slot, tl.sum(tl.where(mask, tl.exp2((x - chunk_max) * scale), 0.0), 0))
    tl.store(min_key_ptr + slot, tl.min(tl.where(mask, _order_key(x, ZERO_BITS), 1 << 40), 0))


@triton.jit
def _init_search_kernel(
    chunk_max_ptr,
    chunk_sum_ptr,
    min_key_ptr,
    temperatures_ptr,
    top_k_ptr,
    min_p_ptr,
    max_ptr,
    scale_ptr,
    lo_ptr,
    hi_ptr,
    lo_mass_ptr,
    max_key_ptr,
    count_target_ptr,
    min_p_value_ptr,
    vocab,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    ZERO_BITS: tl.constexpr,
):
    # per row: the largest logit, log2(e) / T, the top-k search's interval [lo, hi), the mass at lo
    # (all of it) and the target
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS_PAD)
    valid = chunks < NUM_CHUNKS
    chunk_max = tl.load(chunk_max_ptr + row * NUM_CHUNKS + chunks, mask=valid, other=float("-inf"))
    m = tl.max(chunk_max, 0)
    min_key = tl.min(tl.load(min_key_ptr + row * NUM_CHUNKS + chunks, mask=valid, other=1 << 40), 0)
    max_key = _order_key(m, ZERO_BITS)
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    scale = tl.where(temperature > 0, _LOG2E / temperature, 0.0)
    chunk_sum = tl.load(chunk_sum_ptr + row * NUM_CHUNKS + chunks, mask=valid, other=0.0)
    top_k = tl.load(top_k_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    truncates = (temperature > 0) & ((top_k < vocab) | (min_p > 0))
    tl.store(max_ptr + row, m)
    tl.store(scale_ptr + row, scale)
    tl.store(lo_mass_ptr + row, tl.sum(tl.where(valid, chunk_sum * tl.exp2((chunk_max - m) * scale), 0.0), 0))
    tl.store(lo_ptr + row, min_key)
    tl.store(hi_ptr + row, tl.where(truncates, max_key + 1, min_key + 1))
    tl.store(max_key_ptr + row, max_key)
    tl.store(count_target_ptr + row, tl.minimum(top_k, vocab))
    # min-p keeps x >= m + T ln(min_p) = m + log2(min_p) / scale
    tl.store(min_p_value_ptr + row, tl.where(min_p > 0, m + tl.log2(min_p) * temperature / _LOG2E, float("-inf")))


@triton.jit
def _count_at_least_kernel(
    logits_ptr,
    value_ptr,
    partial_ptr,
    vocab,
    stride_row,
    NUM_CHUNKS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # partial: [rows, chunks] int64, each chunk's count of logits >= the row's value (min-p's bound)
    row, chunk = tl.program_id(0), tl.program_id(1)
    value = tl.load(value_ptr + row)
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < tl.where(value > float("-inf"), vocab, 0)  # rows without min-p read nothing
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offsets, mask=mask, other=float("-inf"))
    tl.store(partial_ptr + row * NUM_CHUNKS + chunk, tl.sum((mask & (x.to(tl.float32) >= value)).to(tl.int64), 0))


@triton.jit
def _min_p_target_kernel(partial_ptr, value_ptr, count_target_ptr, NUM_CHUNKS: tl.constexpr, CHUNKS_PAD: tl.constexpr):
    # min-p and top-k together keep the top min(k, count(x >= min-p's bound)) logits
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS_PAD)
    count = tl.sum(tl.load(partial_ptr + row * NUM_CHUNKS + chunks, mask=chunks < NUM_CHUNKS, other=0), 0)
    if tl.load(value_ptr + row) > float("-inf"):
        tl.store(count_target_ptr + row, tl.minimum(tl.load(count_target_ptr + row), count))


@triton.jit
def _pivot_totals_kernel(
    logits_ptr,
    max_ptr,
    scale_ptr,
    lo_ptr,
    hi_ptr,
    counts_ptr,
    masses_ptr,
    vocab,
    stride_row,
    NUM_CHUNKS: tl.constexpr,
    PIVOTS: tl.constexpr,
    ZERO_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # counts, masses: [rows, chunks, PIVOTS], the chunk's count and mass of logits at or above each pivot key
    row, chunk = tl.program_id(0), tl.program_id(1)
    lo = tl.load(lo_ptr + row)
    hi = tl.load(hi_ptr + row)
    if hi - lo > 1:  # a row whose search is done reads nothing
        pivots = lo + ((hi - lo) * (tl.arange(0, PIVOTS) + 1)) // (PIVOTS + 1)  # [PIVOTS], ascending
        x, mask = _load_row_chunk(logits_ptr, row, chunk, vocab, stride_row, BLOCK)
        weights = tl.where(mask, tl.exp2((x - tl.load(max_ptr + row)) * tl.load(scale_ptr + row)), 0.0)
        above = (_order_key(x, ZERO_BITS)[None, :] >= pivots[:, None]) & mask[None, :]  # [PIVOTS, BLOCK]
        out = (row * NUM_CHUNKS + chunk) * PIVOTS + tl.arange(0, PIVOTS)
        tl.store(counts_ptr + out, tl.sum(above.to(tl.int64), 1))
        tl.store(masses_ptr + out, tl.sum(tl.where(above, weights[None, :], 0.0), 1))


@triton.jit
def _narrow_kernel(
    counts_ptr,
    masses_ptr,
    lo_ptr,
    hi_ptr,
    lo_mass_ptr,
    count_target_ptr,
    mass_target_ptr,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    PIVOTS: tl.constexpr,
    BY_MASS: tl.constexpr,
):
    # the row's interval narrowed to the pivots around its target (a count, or with BY_MASS a mass),
    # and the mass at its new lo
    row = tl.program_id(0)
    lo = tl.load(lo_ptr + row)
    hi = tl.load(hi_ptr + row)
    if hi - lo > 1:
        j = tl.arange(0, PIVOTS)
        chunks = tl.arange(0, CHUNKS_PAD)
        slots = (row * NUM_CHUNKS + chunks[:, None]) * PIVOTS + j[None, :]  # [CHUNKS_PAD, PIVOTS]
        valid = (chunks < NUM_CHUNKS)[:, None]
        counts = tl.sum(tl.load(counts_ptr + slots, mask=valid, other=0), 0)
        masses = tl.sum(tl.load(masses_ptr + slots, mask=valid, other=0.0), 0)
        if BY_MASS:
            reached = masses >= tl.load(mass_target_ptr + row)
        else:
            reached = counts >= tl.load(count_target_ptr + row)
        pivots = lo + ((hi - lo) * (j + 1)) // (PIVOTS + 1)
        tl.store(lo_ptr + row, tl.max(tl.where(reached, pivots, lo), 0))
        tl.store(hi_ptr + row, tl.min(tl.where(reached, hi, pivots), 0))
        # mass falls as the key rises: the highest pivot reached has the least mass among those reached
        tl.store(lo_mass_ptr + row, tl.min(tl.where(reached, masses, tl.load(lo_mass_ptr + row)), 0))


@triton.jit
def _top_p_search_kernel(
    lo_ptr,
    hi_ptr,
    lo_mass_ptr,
    max_key_ptr,
    temperatures_ptr,
    top_p_ptr,
    mass_target_ptr,
):
    # top-p searches from the top-k threshold up: it keeps mass >= p times the mass kept so far
    row = tl.program_id(0)
    top_p = tl.load(top_p_ptr + row)
    lo = tl.load(lo_ptr + row)
    active = (top_p < 1) & (tl.load(temperatures_ptr + row).to(tl.float32) > 0)
    tl.store(hi_ptr + row, tl.where(active, tl.load(max_key_ptr + row) + 1, lo + 1))
    tl.store(mass_target_ptr + row, top_p * tl.load(lo_mass_ptr + row))


@triton.jit
def _threshold_kernel(lo_ptr, temperatures_ptr, thresholds_ptr, ZERO_BITS: tl.constexpr):
    row = tl.program_id(0)
    value = _key_value(tl.load(lo_ptr + row), ZERO_BITS)
    tl.store(thresholds_ptr + row, tl.where(tl.load(temperatures_ptr + row).to(tl.float32) > 0, value, float("-inf")))


def _passes(dtype: torch.dtype) -> int:
    """Passes that narrow any interval of keys of `dtype` to one key."""
    passes, width = 0, 1 << _KEY_BITS[dtype]
    while width > 1:
        width = -(-width // (_PIVOTS + 1))
        passes += 1
    return passes


def truncation_thresholds(
    logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Per row, the smallest logit that min-p, top-k and top-p keep at the row's temperature (-inf for
    greedy rows); logits tied with it are kept too."""
    # logits: [rows, vocab]; temperatures, top_p, min_p: [rows] float; top_k: [rows] int64 -> [rows] float32
    rows, vocab = logits.shape
    assert logits.stride(1) == 1 and logits.dtype in _ZERO_BITS
    zero_bits = _ZERO_BITS[logits.dtype]
    num_chunks = triton.cdiv(vocab, _BLOCK)
    chunks_pad = triton.next_power_of_2(num_chunks)
    device = logits.device
    f32, i64 = dict(dtype=torch.float32, device=device), dict(dtype=torch.int64, device=device)
    chunk_max, chunk_sum = torch.empty(rows, num_chunks, **f32), torch.empty(rows, num_chunks, **f32)
    chunk_min_key = torch.empty(rows, num_chunks, **i64)
    row_max, scale, min_p_value, mass_target, lo_mass = (torch.empty(rows, **f32) for _ in range(5))
    lo, hi, max_key, count_target = (torch.empty(rows, **i64) for _ in range(4))
    counts = torch.empty(rows, num_chunks, _PIVOTS, **i64)
    masses = torch.empty(rows, num_chunks, _PIVOTS, **f32)
    grid = (rows, num_chunks)
    _chunk_stats_kernel[grid](
        logits,
        temperatures,
        chunk_max,
        chunk_sum,
        chunk_min_key,
        vocab,
        logits.stride(0),
        NUM_CHUNKS=num_chunks,
        ZERO_BITS=zero_bits,
        BLOCK=_BLOCK,
    )
    _init_search_kernel[(rows,)](
        chunk_max,
        chunk_sum,
        chunk_min_key,
        temperatures,
        top_k,
        min_p,
        row_max,
        scale,
        lo,
        hi,
        lo_mass,
        max_key,
        count_target,
        min_p_value,
        vocab,
        NUM_CHUNKS=num_chunks,
        CHUNKS_PAD=chunks_pad,
        ZERO_BITS=zero_bits,
    )
    min_p_counts = torch.empty(rows, num_chunks, **i64)
    _count_at_least_kernel[grid](
        logits, min_p_value, min_p_counts, vocab, logits.stride(0), NUM_CHUNKS=num_chunks, BLOCK=_BLOCK
    )
    _min_p_target_kernel[(rows,)](min_p_counts, min_p_value, count_target, NUM_CHUNKS=num_chunks, CHUNKS_PAD=chunks_pad)
    for by_mass in (False, True):
        if by_mass:
            _top_p_search_kernel[(rows,)](lo, hi, lo_mass, max_key, temperatures, top_p, mass_target)
        for _ in range(_passes(logits.dtype)):
            _pivot_totals_kernel[grid](
                logits,
                row_max,
                scale,
                lo,
                hi,
                counts,
                masses,
                vocab,
                logits.stride(0),
                NUM_CHUNKS=num_chunks,
                PIVOTS=_PIVOTS,
                ZERO_BITS=zero_bits,
                BLOCK=_BLOCK,
            )
            _narrow_kernel[(rows,)](
                counts,
                masses,
                lo,
                hi,
                lo_mass,
                count_target,
                mass_target,
                NUM_CHUNKS=num_chunks,
                CHUNKS_PAD=chunks_pad,
                PIVOTS=_PIVOTS,
                BY_MASS=by_mass,
            )
    thresholds = torch.empty(rows, **f32)
    _threshold_kernel[(rows,)](lo, temperatures, thresholds, ZERO_BITS=zero_bits)
    return thresholds
