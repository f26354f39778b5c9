"""Triton kernels: the largest logits of each row, found without sorting the vocabulary.

Two uses: truncation thresholds for min-p, top-k and top-p (`truncation_thresholds`),
and the k most likely tokens with their log-probabilities (`top_logprobs`).

Every truncation keeps an upper set of a row's logits, so one number says what
a row keeps: its smallest kept logit, the threshold. The sampler then draws
only among logits at or above it (`gumbel_max_sample(..., thresholds)`). With m
the row's largest logit, T its temperature and w(x) = exp((x - m) / T):

- min-p keeps x >= m + T ln(min_p);
- top-k keeps the logits at or above the k-th largest (logits tied with it too);
- top-p, applied after them as vLLM does, keeps the fewest largest logits whose
  w, summed, reaches p times the sum of w over what min-p and top-k keep.

What a row keeps is almost always a few dozen logits, so it is found among few
candidates rather than by a sort of the vocabulary:

1. `_chunk_stats_kernel` (rows x chunks): each chunk's largest logit and sum of
   w, and the largest logit of each run of `_RUN` logits.
2. `_lower_bound_kernel` (rows): the bound L, a value just below the k-th
   largest run maximum (k = top-k, else `_BOUND_K`) found by a few rounds of
   counting against pivots, raised to min-p's value where that is larger. At
   least k logits are >= L, so top-k's threshold is >= L.
3. `_gather_kernel` (rows x chunks): every logit >= L into a buffer of
   `candidates` entries per row (value and index packed in one int64).
4. `_select_kernel` (rows): the buffer sorted (its first `_FEW_CANDIDATES`
   entries only, where no more were gathered, as is usual) and each threshold
   read from it. This is exact whenever the buffer holds every logit >= L and
   the kept set lies within them.
5. `_fallback_kernel` (rows): the rare rows where that fails (top-p alone over a
   flat distribution, a top-k larger than the runs bound, more logits tied at L
   than the buffer holds) find their threshold by bisection over the logits'
   order keys, one read of the row per step; the other rows return at once.

The top-k logprobs take steps 1 to 3 at temperature 1 with top-k k (the gather
also counts the logits above the chosen token's, its rank), then
`_top_k_kernel` reads the k largest from the sorted buffer (or, where it
overflowed, by k passes over the row) and subtracts the row's log-sum-exp,
m + ln(sum of w).

Every launch has a fixed grid, so a CUDA graph can capture them. Layout:
logits [rows, vocab] (last dim contiguous; bf16, fp16 or fp32); temperatures
[rows] (0 = greedy: no truncation), top_k [rows] int64 (>= vocab: off), top_p
[rows] float32 (1: off), min_p [rows] float32 (0: off).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_CHUNK = 2048  # logits per program of the passes over the vocabulary
_RUN = 128  # logits per run whose maximum bounds top-k from below
_BOUND_K = 256  # the bound for rows without top-k: top-p and min-p rarely keep more logits
_CANDIDATES = 1024  # buffer entries per row
_FEW_CANDIDATES = 128  # rows that gathered no more sort this much of the buffer only
_BOUND_PIVOTS = tl.constexpr(8)  # the bound's search: pivots per round and rounds
_BOUND_ROUNDS = tl.constexpr(4)
_FALLBACK_BLOCK = 4096
_LOG2E = tl.constexpr(1.4426950408889634)
# low bits of a float32's pattern that are always zero for values of each dtype
_ZERO_BITS = {torch.bfloat16: 16, torch.float16: 13, torch.float32: 0}


@triton.jit
def _order_key(x, ZERO_BITS: tl.constexpr):
    """An int32 that orders as the float32 `x` does (negative patterns flipped), less its always-zero bits."""
    bits = x.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)) >> ZERO_BITS


@triton.jit
def _key_value(key, ZERO_BITS: tl.constexpr):
    """The float32 whose `_order_key` is `key`."""
    low = tl.where(key < 0, (1 << ZERO_BITS) - 1, 0)  # a negative pattern's flipped zero bits
    full = (key << ZERO_BITS) | low
    return (full ^ ((full >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _settings(temperatures_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab):
    """A row's temperature, top-k, top-p and min-p, and whether any of the three truncates."""
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    truncates = (temperature > 0) & ((top_k < vocab) | (top_p < 1) | (min_p > 0))
    return temperature, top_k, top_p, min_p, truncates


@triton.jit
def _load_chunk(logits_ptr, row, start, vocab, stride_row, BLOCK: tl.constexpr):
    """Logits start .. start + BLOCK of a row as float32 (-inf past the vocabulary), their offsets and mask."""
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offsets, mask=mask, other=float("-inf"))
    return x.to(tl.float32), offsets, mask


@triton.jit
def _weights(x, m, scale):
    """w = 2^((x - m) scale), 0 for -inf logits (also where m is -inf, which would give NaN)."""
    return tl.where(x > float("-inf"), tl.exp2((x - m) * scale), 0.0)


@triton.jit
def _chunk_stats_kernel(
    logits_ptr,
    temperatures_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    chunk_max_ptr,
    chunk_sum_ptr,
    run_max_ptr,
    vocab,
    stride_row,
    NUM_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
    RUNS: tl.constexpr,
):
    # chunk_max, chunk_sum: [rows, chunks]; run_max: [rows, chunks * RUNS], the maxima of RUNS runs per chunk
    row, chunk = tl.program_id(0), tl.program_id(1)
    temperature, top_k, top_p, min_p, truncates = _settings(
        temperatures_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
    )
    if truncates:
        x, offsets, mask = _load_chunk(logits_ptr, row, chunk * CHUNK, vocab, stride_row, CHUNK)
        chunk_max = tl.max(x, 0)
        tl.store(chunk_max_ptr + row * NUM_CHUNKS + chunk, chunk_max)
        tl.store(chunk_sum_ptr + row * NUM_CHUNKS + chunk, tl.sum(_weights(x, chunk_max, _LOG2E / temperature), 0))
        run_max = tl.max(tl.reshape(x, [RUNS, CHUNK // RUNS]), 1)
        tl.store(run_max_ptr + (row * NUM_CHUNKS + chunk) * RUNS + tl.arange(0, RUNS), run_max)


@triton.jit
def _run_bound(run_max, m, k):
    """A value with at least k run maxima at or above it, close below the k-th largest: an interval [lo, hi]
    with k maxima >= lo and fewer >= hi, narrowed `_BOUND_ROUNDS` times to its pivots around the k-th
    (-inf when fewer than k runs hold a finite logit)."""
    finite = run_max > float("-inf")
    lo = tl.min(tl.where(finite, run_max, float("inf")), 0)
    hi = m
    pivot = tl.arange(0, _BOUND_PIVOTS)
    for _ in tl.static_range(_BOUND_ROUNDS):
        pivots = lo + (hi - lo) * (pivot + 1).to(tl.float32) / (_BOUND_PIVOTS + 1)  # [PIVOTS], ascending
        counts = tl.sum((run_max[None, :] >= pivots[:, None]).to(tl.int32), 1)
        reached = counts >= k
        lo = tl.maximum(lo, tl.max(tl.where(reached, pivots, float("-inf")), 0))
        hi = tl.minimum(hi, tl.min(tl.where(reached, float("inf"), pivots), 0))
    return tl.where(tl.sum(finite.to(tl.int32), 0) >= k, lo, float("-inf"))


@triton.jit
def _lower_bound_kernel(
    chunk_max_ptr,
    chunk_sum_ptr,
    run_max_ptr,
    temperatures_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    row_max_ptr,
    row_sum_ptr,
    bound_ptr,
    count_ptr,
    vocab,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    NUM_RUNS: tl.constexpr,
    RUNS_PAD: tl.constexpr,
    BOUND_K: tl.constexpr,
):
    # per row: m, the sum of w over the row, the bound L, and the gather's count set to 0
    row = tl.program_id(0)
    temperature, top_k, top_p, min_p, truncates = _settings(
        temperatures_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
    )
    if truncates:
        scale = _LOG2E / temperature
        chunks = tl.arange(0, CHUNKS_PAD)
        valid = chunks < NUM_CHUNKS
        chunk_max = tl.load(chunk_max_ptr + row * NUM_CHUNKS + chunks, mask=valid, other=float("-inf"))
        m = tl.max(chunk_max, 0)
        chunk_sum = tl.load(chunk_sum_ptr + row * NUM_CHUNKS + chunks, mask=valid, other=0.0)
        tl.store(row_max_ptr + row, m)
        tl.store(row_sum_ptr + row, tl.sum(chunk_sum * _weights(chunk_max, m, scale), 0))
        k = tl.where(top_k < vocab, top_k, BOUND_K)
        runs = tl.arange(0, RUNS_PAD)
        run_max = tl.load(run_max_ptr + row * NUM_RUNS + runs, mask=runs < NUM_RUNS, other=float("-inf"))
        min_p_value = tl.where(min_p > 0, m + tl.log2(min_p) * temperature / _LOG2E, float("-inf"))
        tl.store(bound_ptr + row, tl.maximum(_run_bound(run_max, m, k), min_p_value))
        tl.store(count_ptr + row, 0)


@triton.jit
def _gather_kernel(
    logits_ptr,
    temperatures_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    bound_ptr,
    count_ptr,
    candidates_ptr,
    chosen_ptr,
    rank_ptr,
    vocab,
    stride_row,
    CHUNK: tl.constexpr,
    CANDIDATES: tl.constexpr,
    RANK: tl.constexpr,
):
    # candidates: [rows, CANDIDATES] int64, each the logit's order key << 32 | its index; count: [rows]
    # int32, how many logits are >= L (more than the buffer holds when it overflows). With RANK, this pass
    # over the logits also counts those above the chosen token's (chosen: [rows] int64) into rank: [rows]
    # int32, which starts at 1
    row, chunk = tl.program_id(0), tl.program_id(1)
    temperature, top_k, top_p, min_p, truncates = _settings(
        temperatures_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
    )
    if truncates:
        x, offsets, mask = _load_chunk(logits_ptr, row, chunk * CHUNK, vocab, stride_row, CHUNK)
        if RANK:
            chosen = tl.load(logits_ptr + row.to(tl.int64) * stride_row + tl.load(chosen_ptr + row)).to(tl.float32)
            tl.atomic_add(rank_ptr + row, tl.sum((mask & (x > chosen)).to(tl.int32), 0))
        take = mask & (x >= tl.load(bound_ptr + row))
        taken = take.to(tl.int32)
        n = tl.sum(taken, 0)
        if n > 0:
            slots = tl.atomic_add(count_ptr + row, n) + tl.cumsum(taken, 0) - 1
            packed = (_order_key(x, 0).to(tl.int64) << 32) | offsets.to(tl.int64)
            tl.store(candidates_ptr + row * CANDIDATES + slots, packed, mask=take & (slots < CANDIDATES))


@triton.jit
def _sorted_buffer(candidates_ptr, row, n, CANDIDATES: tl.constexpr, SIZE: tl.constexpr):
    """The first SIZE entries of a row's buffer, largest first ([SIZE] int64), and which of them hold a logit."""
    slots = tl.arange(0, SIZE)
    held = slots < n
    packed = tl.load(candidates_ptr + row * CANDIDATES + slots, mask=held, other=-(1 << 63))
    return tl.sort(packed, descending=True), held


@triton.jit
def _threshold_from_buffer(
    candidates_ptr, row, n, m, bound, row_sum, temperature, top_k, top_p, min_p, vocab, CANDIDATES, SIZE
):
    """A row's threshold read from its buffer's first SIZE entries (all it holds), and 1 where the buffer
    cannot tell it."""
    packed, held = _sorted_buffer(candidates_ptr, row, n, CANDIDATES, SIZE)
    slots = tl.arange(0, SIZE)
    scale = _LOG2E / temperature
    values = tl.where(held, _key_value((packed >> 32).to(tl.int32), 0), float("-inf"))
    weights = _weights(values, m, scale)
    # the buffer holds the row's n largest logits, every logit >= L, unless it overflowed
    complete = n <= CANDIDATES
    top_k_value = tl.max(tl.where(slots == top_k - 1, values, float("-inf")), 0)
    min_p_value = tl.where(min_p > 0, m + tl.log2(min_p) * temperature / _LOG2E, float("-inf"))
    kept = tl.maximum(tl.where(top_k < vocab, top_k_value, float("-inf")), min_p_value)
    # what min-p and top-k keep lies in the buffer, or they keep the whole row (top-p alone); fewer than
    # top-k logits >= L happens only where min-p's bound raised L, and then min-p keeps fewer than top-k
    known = complete & (kept >= bound)
    whole_row = kept == float("-inf")
    kept_sum = tl.where(whole_row, row_sum, tl.sum(tl.where(values >= kept, weights, 0.0), 0))
    reached = held & (tl.cumsum(weights, 0) >= top_p * kept_sum)
    top_p_value = tl.max(tl.where(reached, values, float("-inf")), 0)  # the first reached, the largest
    threshold = kept
    unresolved = (~known).to(tl.int32)
    if top_p < 1:
        threshold = tl.maximum(kept, top_p_value)
        unresolved = (~(complete & (known | whole_row) & (top_p_value > float("-inf")))).to(tl.int32)
    return threshold, unresolved


@triton.jit
def _select_kernel(
    candidates_ptr,
    count_ptr,
    row_max_ptr,
    row_sum_ptr,
    bound_ptr,
    temperatures_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    thresholds_ptr,
    unresolved_ptr,
    vocab,
    CANDIDATES: tl.constexpr,
    FEW: tl.constexpr,
):
    # thresholds: [rows] float32 (-inf: keep every logit); unresolved: [rows] int32, 1 where the
    # buffer cannot tell the threshold and the fallback must search it
    row = tl.program_id(0)
    temperature, top_k, top_p, min_p, truncates = _settings(
        temperatures_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
    )
    threshold = float("-inf")
    unresolved = 0
    if truncates:
        n = tl.load(count_ptr + row)
        row_state = (tl.load(row_max_ptr + row), tl.load(bound_ptr + row), tl.load(row_sum_ptr + row))
        settings = (temperature, top_k, top_p, min_p, vocab)
        if n <= FEW:  # the usual case: a sort of few entries
            threshold, unresolved = _threshold_from_buffer(
                candidates_ptr, row, n, *row_state, *settings, CANDIDATES, FEW
            )
        else:
            threshold, unresolved = _threshold_from_buffer(
                candidates_ptr, row, n, *row_state, *settings, CANDIDATES, CANDIDATES
            )
    tl.store(thresholds_ptr + row, threshold)
    tl.store(unresolved_ptr + row, unresolved)


@triton.jit
def _totals_at_least(logits_ptr, row, key, m, scale, vocab, stride_row, ZERO_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """How many of the row's logits have an order key >= `key`, and their sum of w."""
    count = 0
    total = 0.0
    for start in range(0, vocab, BLOCK):
        x, offsets, mask = _load_chunk(logits_ptr, row, start, vocab, stride_row, BLOCK)
        above = mask & (_order_key(x, ZERO_BITS) >= key)
        count += tl.sum(above.to(tl.int32), 0)
        total += tl.sum(tl.where(above, _weights(x, m, scale), 0.0), 0)
    return count, total


@triton.jit
def _fallback_kernel(
    logits_ptr,
    unresolved_ptr,
    row_max_ptr,
    temperatures_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    thresholds_ptr,
    vocab,
    stride_row,
    ZERO_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # an unresolved row's threshold by bisection: the largest key whose count (top-k, min-p), then
    # whose sum of w (top-p), still reaches the target; the interval [lo, hi) always has lo reaching it
    row = tl.program_id(0)
    if tl.load(unresolved_ptr + row) != 0:
        temperature, top_k, top_p, min_p, truncates = _settings(
            temperatures_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, vocab
        )
        scale = _LOG2E / temperature
        m = tl.load(row_max_ptr + row)
        # int64: an fp32 interval of keys is wider than an int32 holds
        top_key = _order_key(m, ZERO_BITS).to(tl.int64)
        lo = _order_key(tl.full([], float("-inf"), tl.float32), ZERO_BITS).to(tl.int64)
        target = tl.minimum(top_k, vocab)
        if min_p > 0:
            min_p_value = m + tl.log2(min_p) * temperature / _LOG2E
            min_p_key = _order_key(min_p_value, ZERO_BITS)
            # the key of the smallest value of the logits' dtype at or above min-p's bound
            min_p_key = tl.where(_key_value(min_p_key, ZERO_BITS) < min_p_value, min_p_key + 1, min_p_key)
            min_p_key = min_p_key.to(tl.int64)
            count, total = _totals_at_least(logits_ptr, row, min_p_key, m, scale, vocab, stride_row, ZERO_BITS, BLOCK)
            target = tl.minimum(target, count)
        if target < vocab:
            hi = top_key + 1
            while hi - lo > 1:
                mid = lo + (hi - lo) // 2
                count, total = _totals_at_least(logits_ptr, row, mid, m, scale, vocab, stride_row, ZERO_BITS, BLOCK)
                if count >= target:
                    lo = mid
                else:
                    hi = mid
        if top_p < 1:
            count, kept_sum = _totals_at_least(logits_ptr, row, lo, m, scale, vocab, stride_row, ZERO_BITS, BLOCK)
            hi = top_key + 1
            while hi - lo > 1:
                mid = lo + (hi - lo) // 2
                count, total = _totals_at_least(logits_ptr, row, mid, m, scale, vocab, stride_row, ZERO_BITS, BLOCK)
                if total >= top_p * kept_sum:
                    lo = mid
                else:
                    hi = mid
        tl.store(thresholds_ptr + row, _key_value(lo.to(tl.int32), ZERO_BITS))


@triton.jit
def _store_top_k(candidates_ptr, row, n, k, log_sum_exp, ids_ptr, logprobs_ptr, CANDIDATES, SIZE):
    """The k largest of a row's buffer (all of it in its first SIZE entries): ids and log-probabilities."""
    packed, held = _sorted_buffer(candidates_ptr, row, n, CANDIDATES, SIZE)
    slots = tl.arange(0, SIZE)
    tl.store(ids_ptr + slots, packed & 0xFFFFFFFF, mask=slots < k)
    tl.store(logprobs_ptr + slots, _key_value((packed >> 32).to(tl.int32), 0) - log_sum_exp, mask=slots < k)


@triton.jit(do_not_specialize=["k"])  # one compiled kernel for every k a request asks for
def _top_k_kernel(
    logits_ptr,
    candidates_ptr,
    count_ptr,
    row_max_ptr,
    row_sum_ptr,
    ids_ptr,
    logprobs_ptr,
    log_sum_exp_ptr,
    k,
    vocab,
    stride_row,
    CANDIDATES: tl.constexpr,
    FEW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # ids: [rows, k] int64 and logprobs: [rows, k] float32, most likely first (ties: the higher index first);
    # log_sum_exp: [rows] float32
    row = tl.program_id(0)
    log_sum_exp = tl.load(row_max_ptr + row) + tl.log2(tl.load(row_sum_ptr + row)) / _LOG2E
    tl.store(log_sum_exp_ptr + row, log_sum_exp)
    n = tl.load(count_ptr + row)
    out = row * k
    if n <= FEW:  # the usual case: a sort of few entries
        _store_top_k(candidates_ptr, row, n, k, log_sum_exp, ids_ptr + out, logprobs_ptr + out, CANDIDATES, FEW)
    elif n <= CANDIDATES:
        _store_top_k(candidates_ptr, row, n, k, log_sum_exp, ids_ptr + out, logprobs_ptr + out, CANDIDATES, CANDIDATES)
    else:  # the buffer overflowed: each next largest (value, index) below the last, by a pass over the row
        last = tl.full([], (1 << 63) - 1, tl.int64)
        for j in range(0, k):
            best = tl.full([], -(1 << 63), tl.int64)
            for start in range(0, vocab, BLOCK):
                x, offsets, mask = _load_chunk(logits_ptr, row, start, vocab, stride_row, BLOCK)
                packed = (_order_key(x, 0).to(tl.int64) << 32) | offsets.to(tl.int64)
                best = tl.maximum(best, tl.max(tl.where(mask & (packed < last), packed, -(1 << 63)), 0))
            tl.store(ids_ptr + out + j, best & 0xFFFFFFFF)
            tl.store(logprobs_ptr + out + j, _key_value((best >> 32).to(tl.int32), 0) - log_sum_exp)
            last = best


@dataclass
class _Candidates:
    """Steps 1 to 3 for every row: its largest logit and sum of w, its bound and the gathered logits."""

    row_max: torch.Tensor  # [rows] float32
    row_sum: torch.Tensor  # [rows] float32
    bound: torch.Tensor  # [rows] float32
    count: torch.Tensor  # [rows] int32: logits >= the bound, more than the buffer holds when it overflowed
    buffer: torch.Tensor  # [rows, candidates] int64: order key << 32 | index


def _gather_candidates(
    logits: torch.Tensor,
    settings: tuple[torch.Tensor, ...],
    candidates: int,
    chosen: torch.Tensor | None = None,
    ranks: torch.Tensor | None = None,
) -> _Candidates:
    """Steps 1 to 3; with `chosen` ids [rows], the gather also adds to `ranks` [rows] int32 how many logits
    lie above each chosen token's."""
    rows, vocab = logits.shape
    assert logits.stride(1) == 1 and logits.dtype in _ZERO_BITS
    num_chunks = triton.cdiv(vocab, _CHUNK)
    num_runs = num_chunks * (_CHUNK // _RUN)
    device = logits.device
    f32 = dict(dtype=torch.float32, device=device)
    chunk_max, chunk_sum = torch.empty(rows, num_chunks, **f32), torch.empty(rows, num_chunks, **f32)
    run_max = torch.empty(rows, num_runs, **f32)
    found = _Candidates(
        *(torch.empty(rows, **f32) for _ in range(3)),
        torch.empty(rows, dtype=torch.int32, device=device),
        torch.empty(rows, candidates, dtype=torch.int64, device=device),
    )
    grid = (rows, num_chunks)
    _chunk_stats_kernel[grid](
        logits,
        *settings,
        chunk_max,
        chunk_sum,
        run_max,
        vocab,
        logits.stride(0),
        NUM_CHUNKS=num_chunks,
        CHUNK=_CHUNK,
        RUNS=_CHUNK // _RUN,
    )
    _lower_bound_kernel[(rows,)](
        chunk_max,
        chunk_sum,
        run_max,
        *settings,
        found.row_max,
        found.row_sum,
        found.bound,
        found.count,
        vocab,
        NUM_CHUNKS=num_chunks,
        CHUNKS_PAD=triton.next_power_of_2(num_chunks),
        NUM_RUNS=num_runs,
        RUNS_PAD=triton.next_power_of_2(num_runs),
        BOUND_K=_BOUND_K,
    )
    _gather_kernel[grid](
        logits,
        *settings,
        found.bound,
        found.count,
        found.buffer,
        chosen,
        ranks,
        vocab,
        logits.stride(0),
        CHUNK=_CHUNK,
        CANDIDATES=candidates,
        RANK=chosen is not None,
    )
    return found


def _row_block(vocab: int) -> int:
    return min(_FALLBACK_BLOCK, triton.next_power_of_2(vocab))


def truncation_thresholds(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    candidates: int = _CANDIDATES,
) -> torch.Tensor:
    """Per row, the smallest logit that min-p, top-k and top-p keep at the row's temperature (-inf for rows
    that keep every logit, greedy rows among them); logits tied with it are kept too. `candidates`, a power
    of two, is the buffer a row's threshold is read from; rows it cannot settle are searched."""
    # logits: [rows, vocab]; temperatures, top_p, min_p: [rows] float; top_k: [rows] int64 -> [rows] float32
    rows, vocab = logits.shape
    settings = (temperatures, top_k, top_p, min_p)
    found = _gather_candidates(logits, settings, candidates)
    thresholds = torch.empty(rows, dtype=torch.float32, device=logits.device)
    unresolved = torch.empty(rows, dtype=torch.int32, device=logits.device)
    _select_kernel[(rows,)](
        found.buffer,
        found.count,
        found.row_max,
        found.row_sum,
        found.bound,
        *settings,
        thresholds,
        unresolved,
        vocab,
        CANDIDATES=candidates,
        FEW=min(_FEW_CANDIDATES, candidates),
    )
    _fallback_kernel[(rows,)](
        logits,
        unresolved,
        found.row_max,
        *settings,
        thresholds,
        vocab,
        logits.stride(0),
        ZERO_BITS=_ZERO_BITS[logits.dtype],
        BLOCK=_row_block(vocab),
    )
    return thresholds


def top_logprobs(
    logits: torch.Tensor, chosen: torch.Tensor, k: int, candidates: int = _CANDIDATES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row, the ids of its k largest logits, largest first, their log-probabilities (log-softmax of the
    logits at temperature 1), the row's log-sum-exp, and the rank of its `chosen` token (1 + how many
    logits lie above it, counted in the same pass over the logits), for 1 <= k < vocab."""
    # logits: [rows, vocab]; chosen: [rows] int64 -> ids [rows, k] int64, logprobs [rows, k] float32,
    # log_sum_exp [rows] float32, ranks [rows] int32
    rows, vocab = logits.shape
    device = logits.device
    settings = (
        torch.ones(rows, dtype=torch.float32, device=device),
        torch.full((rows,), k, dtype=torch.int64, device=device),
        torch.ones(rows, dtype=torch.float32, device=device),
        torch.zeros(rows, dtype=torch.float32, device=device),
    )
    ranks = torch.ones(rows, dtype=torch.int32, device=device)
    found = _gather_candidates(logits, settings, candidates, chosen, ranks)
    ids = torch.empty(rows, k, dtype=torch.int64, device=device)
    logprobs = torch.empty(rows, k, dtype=torch.float32, device=device)
    log_sum_exp = torch.empty(rows, dtype=torch.float32, device=device)
    _top_k_kernel[(rows,)](
        logits,
        found.buffer,
        found.count,
        found.row_max,
        found.row_sum,
        ids,
        logprobs,
        log_sum_exp,
        k,
        vocab,
        logits.stride(0),
        CANDIDATES=candidates,
        FEW=min(_FEW_CANDIDATES, candidates),
        BLOCK=_row_block(vocab),
    )
    return ids, logprobs, log_sum_exp, ranks
