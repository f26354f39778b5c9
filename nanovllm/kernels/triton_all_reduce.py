"""All-reduce (sum) of a small tensor between the GPUs of one host, through buffers every rank maps.

Each rank owns one buffer that every other rank can read and write (symmetric memory, reached over
NVLink): a signal pad of `PAD_BYTES` in front, then two data areas that calls take in turn. A call copies
the rank's tensor into its own buffer's area, meets the other ranks at a barrier, and then either

- one-shot: reads every rank's copy and sums it, in rank order, so that every rank holds the same
  bits; or
- two-shot: sums only the pieces it owns (each block a program moves is cut into a power of two of
  pieces, dealt out to the ranks in turn), writes each sum into every rank's area, meets the others
  again, then reads its own area back.

One-shot moves the least latency-bound traffic for a few kilobytes; two-shot moves 2/world of the
bytes one-shot does over each link, which pays from a few hundred kilobytes at 4 ranks and up.

No barrier ends a call: a rank may return while another still reads its area. The next call writes the
other area, and the one after, which writes this one again, starts only after the rank met every other
at the next call's barrier, which they reach only after they finished this call (a GPU runs one
kernel of a stream after the other).

Barriers are pairwise between the same program on two ranks. Every call launches the same programs, and
each counts the calls it has seen in its own rank's pad (read at the start of a call, written back at
its end, so that a CUDA graph can replay the kernel): call c uses area c % 2, and its barriers are
numbered 2c + 1 and 2c + 2. At barrier e a program writes e into its flag in every peer's pad (release,
system scope) and waits until its own pad holds at least e from every peer (acquire); a program with
no data in this call skips them. One thread of the program signals, waits and acquires for all (with
the program's threads synchronised around it). Reads of the buffers bypass the L1 cache, which could
still hold a line a peer has since written.

The grid never exceeds the GPU's multiprocessors, so every program is resident and no barrier waits on a
program that cannot start. A program that waits also reads `abort` (pinned host memory): set by the host
when a rank has died, it releases every wait, so the process can report the failure instead of hanging.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Programs at most, and never more than the GPU's multiprocessors, so that every one is resident. A read
# from a peer takes about a microsecond and a program waits for each of its blocks before the next: the
# bytes in flight, programs x block, set the bandwidth.
MAX_PROGRAMS = 128
MAX_RANKS = 8
# int32 flags [program, rank], then each program's call count [program]
_COUNTS = tl.constexpr(MAX_PROGRAMS * MAX_RANKS * 4)
PAD_BYTES = 8192
_PAD = tl.constexpr(PAD_BYTES)
_BLOCK = 8192  # elements a program moves at a time
MAX_NORM_HIDDEN = _BLOCK  # the widest row the fused norm takes: a program holds whole rows
_WARPS = 8


@triton.jit
def _barrier(buffers, abort, rank, epoch, WORLD: tl.constexpr, THREADS: tl.constexpr):
    """Wait until the same program on every other rank has reached the barrier numbered `epoch`; what this
    program stored before it is visible to them after it, and theirs to it."""
    slot = tl.program_id(0) * WORLD
    # one thread signals and waits for the program (a tensor of one element per thread, masked to the
    # first): many would queue their atomics on one remote address, and their polls slow the signals
    first = tl.arange(0, THREADS) == 0
    zero = tl.zeros([THREADS], tl.int32)
    tl.debug_barrier()  # every thread's stores precede the signal, which releases them all
    for peer in tl.static_range(WORLD):
        if peer != rank:
            pad = tl.load(buffers + peer).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(pad + slot + rank + zero, epoch, mask=first, sem="release", scope="sys")
    own = tl.load(buffers + rank).to(tl.pointer_type(tl.int32)) + slot
    for peer in tl.static_range(WORLD):
        if peer != rank:
            # a peer may already have signalled the next barrier: "reached" is seen - epoch >= 0, which
            # also holds across the counter's wrap-around
            seen = tl.load(own + peer + zero, mask=first, other=epoch, volatile=True)
            spins = 0
            while tl.min(seen - epoch, 0) < 0:
                seen = tl.load(own + peer + zero, mask=first, other=epoch, volatile=True)
                spins += 1
                # the flag lives in host memory: every thread of 64 programs reading it every 64 polls
                # made a 256 KB call cost 1 ms instead of 9 us
                if spins % 1024 == 0:
                    stop = tl.load(abort + zero, mask=first, other=0, volatile=True)
                    seen = tl.where(stop != 0, epoch, seen)
            tl.atomic_add(own + peer + zero, 0, mask=first, sem="acquire", scope="sys")
    tl.debug_barrier()  # the acquire precedes every thread's reads


@triton.jit
def _data(buffers, r, area, x):
    """Rank `r`'s data area at byte offset `area`, typed as `x`."""
    base = tl.load(buffers + r) + _PAD + area
    return base.to(tl.pointer_type(x.dtype.element_ty))


@triton.jit
def _sum_over_ranks(buffers, area, x, offs, mask, WORLD: tl.constexpr):
    """Every rank's data at `offs`, added in rank order so that every rank gets the same bits."""
    total = tl.zeros(offs.shape, tl.float32)
    for r in tl.static_range(WORLD):
        data = _data(buffers, r, area, x)
        total += tl.load(data + offs, mask=mask, other=0.0, cache_modifier=".cv").to(tl.float32)
    return total.to(x.dtype.element_ty)


@triton.jit
def _row_tile(tile, hidden, rows, ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    """The offsets [ROWS, BLOCK_H] of the rows of tile number `tile` in a [rows, hidden] tensor, and their
    mask."""
    row = tile * ROWS + tl.arange(0, ROWS)
    column = tl.arange(0, BLOCK_H)
    return row[:, None] * hidden + column[None, :], (row < rows)[:, None] & (column < hidden)[None, :]


@triton.jit
def _add_rms_norm_rows(buffers, area, x, residual, weight, offs, mask, hidden, eps, WORLD: tl.constexpr):
    """At `offs` ([ROWS, BLOCK_H] of whole rows): h = sum + residual, written to `residual`, and
    RMSNorm(h) * weight, written to `x`. The sum is rounded to the dtype, as the all-reduce returns it; the
    rest runs in fp32 and is rounded once, as the compiled add and norm of `layers/layernorm.py` (which
    one rank runs) compute it: rounding h and the normalised values on the way flipped greedy tokens."""
    total = _sum_over_ranks(buffers, area, x, offs, mask, WORLD)
    h = total.to(tl.float32) + tl.load(residual + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(residual + offs, h.to(total.dtype), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, axis=1) / hidden + eps)  # [ROWS]
    scale = tl.load(weight + (offs % hidden), mask=mask, other=0.0).to(tl.float32)
    tl.store(x + offs, (h * rstd[:, None] * scale).to(total.dtype), mask=mask)


@triton.jit
def _peer_all_reduce_kernel(
    x,  # [n] this rank's part in, the sum out (with NORM: [rows, hidden], the sum's norm out)
    n,
    residual,  # with NORM: [rows, hidden], h = sum + residual out
    weight,  # with NORM: [hidden]
    hidden,
    eps,
    buffers,  # [WORLD] int64: each rank's buffer address
    abort,  # [1] int32
    rank,
    area_bytes,  # the size of each of a buffer's two data areas
    WORLD: tl.constexpr,
    TWO_SHOT: tl.constexpr,
    PIECES: tl.constexpr,  # the pieces of a block two-shot deals out: WORLD, rounded up to a power of two
    NORM: tl.constexpr,  # one-shot, then the residual add and the RMSNorm, a program taking whole rows
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,  # with NORM, the rows a program takes at a time
    BLOCK_H: tl.constexpr,  # with NORM, hidden rounded up to a power of two
    THREADS: tl.constexpr,  # the program's threads: 32 per warp
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    count = (tl.load(buffers + rank) + _COUNTS).to(tl.pointer_type(tl.int32)) + pid
    call = tl.load(count)
    area = (call & 1).to(tl.int64) * area_bytes
    own = _data(buffers, rank, area, x)
    if NORM:
        rows = n // hidden
        tiles = tl.cdiv(rows, ROWS)
        if pid < tiles:
            for tile in range(pid, tiles, tl.num_programs(0)):
                offs, mask = _row_tile(tile, hidden, rows, ROWS, BLOCK_H)
                tl.store(own + offs, tl.load(x + offs, mask=mask), mask=mask)
            _barrier(buffers, abort, rank, 2 * call + 1, WORLD, THREADS)
            for tile in range(pid, tiles, tl.num_programs(0)):
                offs, mask = _row_tile(tile, hidden, rows, ROWS, BLOCK_H)
                _add_rms_norm_rows(buffers, area, x, residual, weight, offs, mask, hidden, eps, WORLD)
    elif pid * BLOCK < n:
        for start in range(pid * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            tl.store(own + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)
        _barrier(buffers, abort, rank, 2 * call + 1, WORLD, THREADS)
        if TWO_SHOT:
            # within each of its blocks the same program on every rank reads the sums, so the ranks
            # share the block: this rank owns every WORLD-th of its PIECES pieces, from its rank on
            for start in range(pid * BLOCK, n, step):
                for piece in range(rank, PIECES, WORLD):
                    offs = start + piece * (BLOCK // PIECES) + tl.arange(0, BLOCK // PIECES)
                    total = _sum_over_ranks(buffers, area, x, offs, offs < n, WORLD)
                    for r in tl.static_range(WORLD):
                        tl.store(_data(buffers, r, area, x) + offs, total, mask=offs < n)
            _barrier(buffers, abort, rank, 2 * call + 2, WORLD, THREADS)
            for start in range(pid * BLOCK, n, step):
                offs = start + tl.arange(0, BLOCK)
                tl.store(x + offs, tl.load(own + offs, mask=offs < n, cache_modifier=".cv"), mask=offs < n)
        else:
            for start in range(pid * BLOCK, n, step):
                offs = start + tl.arange(0, BLOCK)
                tl.store(x + offs, _sum_over_ranks(buffers, area, x, offs, offs < n, WORLD), mask=offs < n)
    tl.store(count, call + 1)


def peer_all_reduce(
    x: torch.Tensor,
    buffers: torch.Tensor,
    abort: torch.Tensor,
    rank: int,
    area_bytes: int,
    two_shot: bool = False,
    programs: int = MAX_PROGRAMS,
) -> torch.Tensor:
    """Sum `x` over the ranks whose buffers `buffers` holds (every rank calls this with its own `x`), in
    place. Each buffer holds PAD_BYTES + 2 * area_bytes bytes (x.nbytes <= area_bytes), its first
    PAD_BYTES zero before the first call on any rank. `programs`, the grid, is the same in every call
    on these buffers, and at most the GPU's multiprocessors (and MAX_PROGRAMS)."""
    # x: [...] contiguous; buffers: [world] int64 addresses; abort: [1] int32
    _launch(x, buffers, abort, rank, area_bytes, programs, two_shot=two_shot)
    return x


def peer_all_reduce_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    buffers: torch.Tensor,
    abort: torch.Tensor,
    rank: int,
    area_bytes: int,
    programs: int = MAX_PROGRAMS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For `x` a part of a sum over the ranks, as `peer_all_reduce` takes it: h = the sum + residual and
    RMSNorm(h) * weight (one-shot), written over `residual` and `x`; (the norm, h). The rows must fit a
    program (hidden <= MAX_NORM_HIDDEN)."""
    # x, residual: [rows, hidden] contiguous; weight: [hidden]
    hidden = x.size(-1)
    assert residual.shape == x.shape and residual.is_contiguous() and hidden <= MAX_NORM_HIDDEN
    block_h = triton.next_power_of_2(hidden)
    _launch(x, buffers, abort, rank, area_bytes, programs, norm=(residual, weight, eps), block_h=block_h)
    return x, residual


def _launch(x, buffers, abort, rank, area_bytes, programs, two_shot=False, norm=None, block_h=1) -> None:
    assert x.is_contiguous() and x.numel() * x.element_size() <= area_bytes
    assert buffers.numel() <= MAX_RANKS and programs <= MAX_PROGRAMS
    residual, weight, eps = norm or (x, x, 0.0)
    _peer_all_reduce_kernel[(programs,)](
        x,
        x.numel(),
        residual,
        weight,
        x.size(-1) if norm else 1,  # the row width only the norm reads
        eps,
        buffers,
        abort,
        rank,
        area_bytes,
        WORLD=buffers.numel(),
        TWO_SHOT=two_shot,
        PIECES=triton.next_power_of_2(buffers.numel()),
        NORM=norm is not None,
        BLOCK=_BLOCK,
        ROWS=max(1, _BLOCK // block_h),
        BLOCK_H=block_h,
        THREADS=32 * _WARPS,
        num_warps=_WARPS,
    )


# A one-row product (`triton_gemv`, with a `ProductSum`) sums its output over the ranks itself, with no
# kernel of its own: each program pushes its features' sums, rounded to the dtype as a partial output is,
# into row `rank` of every rank's data area, meets the same program on every other rank at a barrier, and
# adds the rows of its own area in rank order (every rank gets the bits `peer_all_reduce` gives). Programs
# of a lane own the same features in every call, which is what lets consecutive calls take the two areas
# in turn with no barrier at the end, as above: a lane serves one BLOCK_N, and a buffer holds a lane for
# each of PRODUCT_LANES. The products of a decode step are launched early (programmatic dependent
# launch), so this sum, unlike a kernel of its own, lets the next product read its weights meanwhile.
PRODUCT_LANES = (4, 8, 16, 32)
PRODUCT_MAX_FEATURES = 16384
_FEATURES = tl.constexpr(PRODUCT_MAX_FEATURES)
_LANE_PROGRAMS = PRODUCT_MAX_FEATURES // min(PRODUCT_LANES)
_LANE_COUNTS = tl.constexpr(_LANE_PROGRAMS * MAX_RANKS * 4)  # int32 flags [program, rank], then counts
_LANE_PAD = tl.constexpr(_LANE_PROGRAMS * (MAX_RANKS + 1) * 4)
_LANE_AREA = tl.constexpr(MAX_RANKS * PRODUCT_MAX_FEATURES * 4)  # [rank, feature], 4-byte values at most
LANE_BYTES = _LANE_PAD.value + 2 * _LANE_AREA.value


@dataclass(frozen=True)
class ProductSum:
    """What a one-row product needs to sum its output over the ranks itself: for each BLOCK_N of
    PRODUCT_LANES, every rank's lane address ([world] int64, in a buffer of LANE_BYTES per lane whose pads
    start zero), the abort flag its waits read, and this rank."""

    lanes: dict[int, torch.Tensor]
    abort: torch.Tensor
    rank: int

    def takes(self, features: int) -> bool:
        """Whether a product of `features` outputs can sum them this way."""
        return features <= PRODUCT_MAX_FEATURES


@triton.jit
def sum_in_program(y, features, feature_ok, out_ptr, lanes, abort, rank, WORLD: tl.constexpr, THREADS: tl.constexpr):
    """The sum over the ranks of this program's fp32 output sums `y` [BLOCK_N] at `features`, rounded to
    `out_ptr`'s dtype: every rank's program of this number calls it with its own part."""
    dtype = out_ptr.dtype.element_ty
    own = tl.load(lanes + rank)
    count = (own + _LANE_COUNTS).to(tl.pointer_type(tl.int32)) + tl.program_id(0)
    call = tl.load(count)
    area = _LANE_PAD + (call & 1).to(tl.int64) * _LANE_AREA
    part = y.to(dtype)
    for r in tl.static_range(WORLD):
        row = (tl.load(lanes + r) + area).to(tl.pointer_type(dtype)) + rank * _FEATURES
        tl.store(row + features, part, mask=feature_ok)
    _barrier(lanes, abort, rank, call + 1, WORLD, THREADS)
    total = tl.zeros(y.shape, tl.float32)
    for r in tl.static_range(WORLD):
        row = (own + area).to(tl.pointer_type(dtype)) + r * _FEATURES
        total += tl.load(row + features, mask=feature_ok, other=0.0, cache_modifier=".cv").to(tl.float32)
    tl.store(count, call + 1)
    return total.to(dtype)
