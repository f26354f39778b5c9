"""Triton kernels: y = W x for one row x, the matrix products of a one-sequence decode step, with the
element-wise step that makes x read inside the product; and for a few rows (a speculative verify step,
a decode step of a few sequences), plain, with the norm in front or with the norm in front and the gated
activation behind.

Layout: W [N, K] contiguous (an nn.Linear weight); y [N], in x's dtype. Grid:
(cdiv(N, BLOCK_N),). A program owns BLOCK_N output features: it streams their
rows of W once, BLOCK_K columns at a time, multiplies them with x (which stays
in cache) and sums in fp32 on the CUDA cores. The product is bound by reading
W; many small programs keep enough loads in flight to read it faster than
cuBLAS's kernels do at one row. Each program issues its first chunk of W
before it waits for the kernel before it (programmatic dependent launch,
`triton_pdl.py`), and the next chunk of W and of the inputs while it
multiplies the current one: one pass, no load waited on inside the loop.
`BLOCKS` holds BLOCK_N, BLOCK_K and the warps per prologue: more features per program read
the inputs fewer times, which pays most where the prologue reads three
vectors. `benchmarks/gemv.py --sweep` times the choices, and `BLOCKS` are
the fastest in decode steps of both Qwen3 shapes; `SHAPE_BLOCKS` holds the
shapes for which another choice is faster (docs/tuning.md).

What x is, by the constexpr PROLOGUE, each program computing it itself from
inputs that stay in cache (a launch costs more than the redundant arithmetic):
- PLAIN: x [K] as given.
- RMS_NORM: x = RMSNorm(a + r) with weight g, from a, r, g [K] (r optional);
  program 0 also writes a + r to h [K], the next residual, rounded to the
  dtype as `layers/layernorm.py` rounds it. The norm's 1/rms is the same for
  every column, so the loop sums W (g * h) and the mean square of h together
  and scales the sum once at the end: one pass over the inputs instead of
  two; the normalised values are not rounded to the dtype in between.
- GATED: x = act(gate) * up, from gate_up [2K] = gate | up, act being the
  constexpr ACT (SiLU or GELU's tanh approximation), computed and rounded to
  the dtype as `triton_gated_activation.py` does for several rows.

A bias b [N], when given, is added to the fp32 sums before they are rounded to
the dtype (the epilogue HAS_BIAS): biased layers (Qwen2's q, k, v) keep the
one-launch path. With SUM_RANKS (a row-parallel product under tensor
parallelism) each program then sums its features over the ranks itself
(`triton_all_reduce.sum_in_program`), so no all-reduce kernel follows.

W may be float8 e4m3 with fp32 scales (`kernels/fp8_weights.py` has the
layout), by the constexpr SCALES: PER_ROW (one scale per output feature,
applied to the row's sum) or PER_BLOCK (one per block of SCALE_ROWS x
SCALE_COLUMNS; a program's features lie in one block of rows). The product
reads half the bytes of a bf16 one and multiplies the dequantized weights
with x unquantized, in fp32: `fp8_weights.fp8_linear(..., quantize_x=False)`
is its reference. Each thread loads VEC = 16 contiguous bytes of a row at
once and sums their products before it adds them to its sums, which hold one
value per group of 16 columns, [BLOCK_N, BLOCK_K / VEC], instead of one per
column: 16x fewer registers, so that a thread keeps 64 to 128 bytes of W in
flight (`FP8_BLOCKS`), as with bf16 weights, where sums per column spilled
beyond 16 bytes. PER_BLOCK scales each group's sum (a group lies in one block of
columns): a load per group, not per column. Where K is a multiple of 4, W is
read as int32 words of four values (WORD), which inline PTX converts two at
a time: carried over to the next iteration (the prefetch), float8 values took
a register each, and Triton's own conversion several instructions a byte to
pack them again (docs/benchmarks.md has the figures). `benchmarks/gemv.py
--fp8 [128x128] --sweep` times `FP8_TILES`.

A few rows (2 to MAX_ROWS) run in a kernel of their own, `_rows_kernel`,
which reads each chunk of W once for all of them: the rows, padded to 16 (the
smallest tensor-core tile), are multiplied with the chunk on the tensor cores
(`tl.dot`, fp32 sums), the loop software-pipelined (`tl.range` stages). Its
PROLOGUE is PLAIN or RMS_NORM, the latter as for one row (1/rms applied to
each row's sums at the end; the programs share the writing of h, after the
loop), with the normalised values rounded to the dtype for the tensor cores
and the inputs loaded a chunk ahead by hand. With GATED_OUTPUT, W is gate |
up ([2N, K]): a program multiplies x with the same features of both halves
and writes act(gate) * up, from the two sums rounded to the dtype, as the
separate activation kernel would compute it: an MLP's norm, gate/up product
and activation are one launch, and its down projection a plain one. The same
bias and FP8 scales apply. Per-channel FP8 weights are converted to x's dtype.
Block-FP8 weights (128 x 128 scales) are multiplied on the FP8 tensor cores
instead: each chunk of x is quantized to float8 per row (one scale each, as
`fp8_weights.fp8_linear` quantizes x per token and 128 columns) and multiplied
with the chunk of W as stored, the sums scaled by both scales; converting every
weight to 16 bits took 1.4-1.5x as long at four rows (docs/benchmarks.md).
`rows_blocks_for` picks its tiles. It lets the next kernel start only after its
loop (`triton_pdl.py` says why).
"""

import math

import torch
import triton
import triton.language as tl

from nanovllm.kernels.fp8_kv import FP8_MAX as FP8_KV_MAX
from nanovllm.kernels.triton_all_reduce import ProductSum, sum_in_program
from nanovllm.kernels.triton_gated_activation import ACTIVATIONS, SILU, gated
from nanovllm.kernels.triton_pdl import compiled_for_gpu, let_next_kernel_start, pdl_launch, wait_for_previous_kernel

PLAIN, RMS_NORM, GATED = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)  # PROLOGUE
NO_SCALES, PER_ROW, PER_BLOCK = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)  # SCALES of FP8 weights
FP8_MAX = tl.constexpr(FP8_KV_MAX)  # e4m3fn's largest finite value, for the kernels
# PROLOGUE -> (BLOCK_N, BLOCK_K, num_warps)
BLOCKS = {PLAIN.value: (4, 2048, 4), RMS_NORM.value: (8, 512, 4), GATED.value: (8, 2048, 4)}
# the same for FP8 weights: the fastest of `FP8_TILES` on the Qwen3.6-27B shape's largest product of each
# prologue, 128 x 128 scales (docs/tuning.md)
FP8_BLOCKS = {PLAIN.value: (8, 1024, 4), RMS_NORM.value: (16, 1024, 4), GATED.value: (16, 1024, 4)}
# the tiles `benchmarks/gemv.py --fp8 [128x128] --sweep` times for one row: 64 to 256 bytes of W a thread per
# chunk (BLOCK_N * BLOCK_K / 32 / warps), none spilling registers in any prologue (ptxas, sm_90a); BLOCK_N
# divides 128 (a block-FP8 weight's rows a scale) and is a lane of `triton_all_reduce.PRODUCT_LANES`
FP8_TILES = (
    (4, 2048, 4),
    (4, 4096, 4),
    (4, 4096, 8),
    (4, 8192, 8),
    (8, 1024, 4),
    (8, 2048, 4),
    (8, 2048, 8),
    (8, 4096, 8),
    (16, 1024, 4),
    (16, 2048, 8),
    (16, 4096, 8),
)
# FP8 weights are read as int32 words of FP8_WORD values, and summed in groups of FP8_VEC columns: a thread's
# 16-byte load (the widest), where K is a multiple of 16
FP8_WORD, FP8_VEC = 4, 16
# (PROLOGUE, N, K) -> (BLOCK_N, BLOCK_K, num_warps) of full-precision weights where `BLOCKS` is not the
# fastest: Qwen3-30B-A3B's qkv and o (`benchmarks/gemv.py --sweep --shapes qwen3-30b-a3b`), and one rank's
# qkv, o, down and LM head of Qwen3-8B at two ranks (`--shapes 8b --tensor-parallel-size 2`)
SHAPE_BLOCKS = {
    (RMS_NORM.value, 5120, 2048): (4, 512, 4),
    (PLAIN.value, 2048, 4096): (8, 2048, 8),
    (RMS_NORM.value, 3072, 4096): (4, 512, 4),
    (PLAIN.value, 4096, 2048): (8, 1024, 4),
    (GATED.value, 4096, 6144): (16, 1024, 4),
    (PLAIN.value, 75968, 4096): (4, 1024, 4),
}
# products of at most this many features (a router, a Gated DeltaNet's b and a) take one or two rows a program
# and 2048 columns a chunk: at the default tiles they gave too few programs to fill the GPU (Qwen3.6-35B-A3B on
# an H200, with the norm in front: the router and shared gate 257 x 2048 3.50 -> 1.71 us, b and a 64 x 2048
# 3.29 -> 1.47 us)
NARROW_FEATURES = 512
# the most rows a product takes: the rows kernel pads them to 16, the smallest tensor-core tile
MAX_ROWS = 16


def blocks_for(prologue: tl.constexpr, n: int, k: int, fp8: bool, summed: bool = False) -> tuple[int, int, int]:
    """BLOCK_N, BLOCK_K and the warps of the product of an [n, k] weight (FP8 or not) with `prologue`;
    `summed`: summed over the ranks in the kernel, whose lanes take BLOCK_N of PRODUCT_LANES."""
    if fp8:
        return FP8_BLOCKS[prologue.value]
    if n <= NARROW_FEATURES and not summed:
        return (1 if n <= NARROW_FEATURES // 4 else 2), 2048, 4
    return SHAPE_BLOCKS.get((prologue.value, n, k), BLOCKS[prologue.value])


def rows_blocks_for(n: int, element_size: int = 2, scale_columns: int | None = None) -> tuple[int, int, int, int]:
    """BLOCK_N, BLOCK_K, warps and pipeline stages of the rows kernel's product of a weight with n features
    and x of `element_size` bytes: narrower tiles for fewer features, so that enough programs read W (the
    fastest of `benchmarks/gemv.py --rows 5 --sweep` on the projections of Qwen3-0.6B and -8B), and
    half as many columns of 4-byte values, whose stages would not fit in shared memory. The narrowest
    products (n <= 2048: Qwen3-0.6B's o and down, fewer programs than an H100 has SMs) read twice as many
    columns a stage, to keep more of W in flight per program. Block-FP8 weights (`scale_columns` a block's
    columns, a multiple of 16) take 128 columns a chunk, or as many as divide a block, so that one scale
    covers each chunk (the fastest of 24 tiles on the Qwen3.6-27B shape's products at four rows)."""
    if scale_columns is not None:
        return (32 if n <= 8192 else 64), math.gcd(scale_columns, 128), 4, 4
    block_n = 16 if n <= 2048 else 32 if n <= 4096 else 64
    block_k = (1024 if n <= 2048 else 512) // element_size
    return block_n, block_k, 4, 4


@triton.jit
def _input_loads(a_ptr, b_ptr, start, columns, K, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The input values chunk `start` is made of: (a, b) [BLOCK_K] each, b = r (RMS_NORM with a
    residual), up (a gated prologue) or a again."""
    k = start + columns
    k_ok = k < K
    a = tl.load(a_ptr + k, mask=k_ok, other=0.0)
    b = a
    if PROLOGUE == GATED:
        b = tl.load(a_ptr + K + k, mask=k_ok, other=0.0)
    elif PROLOGUE == RMS_NORM and HAS_RESIDUAL:
        b = tl.load(b_ptr + k, mask=k_ok, other=0.0)
    return a, b


@triton.jit
def _prologue(a, b, g_ptr, h_ptr, k, K, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ACT: tl.constexpr):
    """x at columns k from the loaded inputs (a, b), fp32 [BLOCK_K], and what the columns add to the
    sum of squares of the norm's input (zero unless RMS_NORM)."""
    k_ok = k < K
    if PROLOGUE == RMS_NORM:
        h = a
        if HAS_RESIDUAL:
            h = (a.to(tl.float32) + b.to(tl.float32)).to(h_ptr.dtype.element_ty)
            if tl.program_id(0) == 0:
                tl.store(h_ptr + k, h, mask=k_ok)
        h = h.to(tl.float32)
        # without 1/rms, which is common to every column: the kernel scales the sum once, at the end
        return tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32) * h, h * h
    if PROLOGUE == GATED:
        x = gated(a, b, ACT).to(a.dtype).to(tl.float32)
        return x, tl.zeros_like(x)
    x = a.to(tl.float32)
    return x, tl.zeros_like(x)


@triton.jit
def _weight_chunk(w_ptr, features, feature_ok, start, columns, K):
    """W[features, start:start + BLOCK_K], zero outside W: [BLOCK_N, BLOCK_K]."""
    k = start + columns
    return tl.load(
        w_ptr + features[:, None].to(tl.int64) * K + k[None, :], mask=feature_ok[:, None] & (k < K)[None, :], other=0.0
    )


@triton.jit
def _e4m3_values(words, PTX: tl.constexpr):
    """The float8 e4m3 values packed four to an int32 of `words` [BLOCK_N, WORDS] (the first in the low byte),
    in fp32: [BLOCK_N, 4 * WORDS]. Compiled for a GPU, in PTX, two values a conversion; Triton's own cast takes
    several more instructions a byte to gather each pair. Triton's interpreter runs no PTX: there, the casts."""
    if PTX:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(
            """{
            .reg .b16 lo, hi;
            .reg .b32 v01, v23;
            mov.b32 {lo, hi}, $4;
            cvt.rn.f16x2.e4m3x2 v01, lo;
            cvt.rn.f16x2.e4m3x2 v23, hi;
            mov.b32 {lo, hi}, v01;
            cvt.f32.f16 $0, lo;
            cvt.f32.f16 $1, hi;
            mov.b32 {lo, hi}, v23;
            cvt.f32.f16 $2, lo;
            cvt.f32.f16 $3, hi;
            }""",
            "=r,=r,=r,=r,r",
            [words],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    else:
        v0 = words.to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v1 = (words >> 8).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v2 = (words >> 16).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v3 = (words >> 24).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    values = tl.join(tl.join(v0, v2), tl.join(v1, v3))  # [BLOCK_N, WORDS, 2, 2]: value 2p + q of a word at [p, q]
    return tl.reshape(values, (words.shape[0], 4 * words.shape[1]))


@triton.jit
def _weight_values(w, WORD: tl.constexpr, PTX: tl.constexpr):
    """A chunk of W as loaded, [BLOCK_N, BLOCK_K // WORD], in fp32: [BLOCK_N, BLOCK_K]."""
    if WORD == 1:
        values = w.to(tl.float32)
    else:
        values = _e4m3_values(w, PTX)
    return values


@triton.jit
def _group_sums(t, VEC: tl.constexpr):
    """t [BLOCK_N, BLOCK_K] summed over each group of VEC contiguous columns, which one thread holds (16-byte
    loads): [BLOCK_N, BLOCK_K // VEC]; t itself for VEC 1."""
    if VEC > 1:
        t = tl.sum(tl.reshape(t, (t.shape[0], t.shape[1] // VEC, VEC)), axis=2)
    return t


@triton.jit
def _group_scales(
    scale_ptr, start, K, SCALE_ROWS, SCALE_COLUMNS, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr
):
    """The PER_BLOCK scales of the chunk at `start`, in this program's block of rows, one per group of VEC
    columns (a group lies in one block of columns): [BLOCK_K // VEC]."""
    k = start + tl.arange(0, BLOCK_K // VEC) * VEC  # each group's first column
    block_row = tl.program_id(0) * BLOCK_N // SCALE_ROWS
    return tl.load(scale_ptr + block_row * tl.cdiv(K, SCALE_COLUMNS) + k // SCALE_COLUMNS, mask=k < K, other=0.0)


@triton.jit
def _gemv_kernel(
    a_ptr,
    r_ptr,
    g_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    y_ptr,
    h_ptr,
    N,
    K,
    eps,
    lanes,  # with SUM_RANKS: [WORLD] int64, every rank's lane of BLOCK_N (`triton_all_reduce.ProductSum`)
    abort,  # with SUM_RANKS: [1] int32
    rank,
    PROLOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    SCALE_COLUMNS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    WORD: tl.constexpr,  # W's values in an element of w_ptr: 1, or FP8_WORD (FP8 W as int32 [N, K / WORD])
    VEC: tl.constexpr,  # columns a thread sums before accumulating: 1 (full-precision W) or FP8_VEC
    PTX: tl.constexpr,  # compiled for a GPU, not run in Triton's interpreter
    SUM_RANKS: tl.constexpr,  # y is this rank's part of a sum over WORLD ranks: write the sum
    WORLD: tl.constexpr,
    THREADS: tl.constexpr,
    PDL: tl.constexpr,
):
    features = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    columns = tl.arange(0, BLOCK_K)
    elements = tl.arange(0, BLOCK_K // WORD)  # of w_ptr in a chunk
    feature_ok = features < N
    # the weights depend on no earlier kernel: the first chunk is read while that kernel finishes
    w = _weight_chunk(w_ptr, features, feature_ok, 0, elements, K // WORD)
    wait_for_previous_kernel(PDL)
    a, b = _input_loads(a_ptr, r_ptr, 0, columns, K, PROLOGUE, HAS_RESIDUAL)
    acc = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)  # a sum per feature and column, or group
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        # the next chunk's weights and inputs are in flight while this one is multiplied
        w_next = _weight_chunk(w_ptr, features, feature_ok, (start + BLOCK_K) // WORD, elements, K // WORD)
        a_next, b_next = _input_loads(a_ptr, r_ptr, start + BLOCK_K, columns, K, PROLOGUE, HAS_RESIDUAL)
        x, squared = _prologue(a, b, g_ptr, h_ptr, start + columns, K, PROLOGUE, HAS_RESIDUAL, ACT)
        if PROLOGUE == RMS_NORM:
            squares += squared
        # W's values [BLOCK_N, BLOCK_K] times x [BLOCK_K], summed by groups of VEC columns
        products = _group_sums(_weight_values(w, WORD, PTX) * x[None, :], VEC)
        if SCALES == PER_BLOCK:
            products *= _group_scales(scale_ptr, start, K, SCALE_ROWS, SCALE_COLUMNS, BLOCK_N, BLOCK_K, VEC)[None, :]
        acc += products
        w, a, b = w_next, a_next, b_next
    y = tl.sum(acc, axis=1)
    if PROLOGUE == RMS_NORM:
        y = y * tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    if SCALES == PER_ROW:
        y *= tl.load(scale_ptr + features, mask=feature_ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + features, mask=feature_ok, other=0.0).to(tl.float32)
    if SUM_RANKS:
        y = sum_in_program(y, features, feature_ok, y_ptr, lanes, abort, rank, WORLD, THREADS)
    tl.store(y_ptr + features, y.to(y_ptr.dtype.element_ty), mask=feature_ok)


@triton.jit
def _rows_loads(x_ptr, r_ptr, rows, row_ok, k, K, stride_x, HAS_RESIDUAL: tl.constexpr):
    """x and r (x again without a residual) at columns k of every row: [ROWS, BLOCK_K] each, zero in the
    padding rows and past K."""
    mask = row_ok[:, None] & (k < K)[None, :]
    a = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + k[None, :], mask=mask, other=0.0)
    r = a
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=mask, other=0.0)
    return a, r


@triton.jit
def _rows_normed(a, r, g_ptr, k, K, HAS_RESIDUAL: tl.constexpr):
    """g * h for h = a + r (a without a residual) rounded to the dtype, in the dtype, and h in fp32:
    [ROWS, BLOCK_K] each. Without 1/rms, common to a row's columns: the kernel scales each row's sums
    once, at the end."""
    h = a
    if HAS_RESIDUAL:
        h = (a.to(tl.float32) + r.to(tl.float32)).to(a.dtype)
    h = h.to(tl.float32)
    g = tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    return (h * g[None, :]).to(a.dtype), h


@triton.jit
def _store_rows_sum(x_ptr, r_ptr, h_ptr, M, K, stride_x, ROWS: tl.constexpr, SUM_BLOCK: tl.constexpr):
    """h = x + r, rounded to the dtype, at this program's SUM_BLOCK columns of every row (h: [M, K],
    contiguous): the programs share the writing of the next residual."""
    rows = tl.arange(0, ROWS)
    k = tl.program_id(0) * SUM_BLOCK + tl.arange(0, SUM_BLOCK)
    mask = (rows < M)[:, None] & (k < K)[None, :]
    a = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + k[None, :], mask=mask, other=0.0)
    at = rows[:, None].to(tl.int64) * K + k[None, :]
    r = tl.load(r_ptr + at, mask=mask, other=0.0)
    tl.store(h_ptr + at, (a.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rows_dot(acc, x, w_ptr, features, feature_ok, k, K, PRECISION: tl.constexpr):
    """acc + x W[features, k]^T: [ROWS, BLOCK_N], on the tensor cores in x's dtype."""
    w = _weight_chunk(w_ptr, features, feature_ok, 0, k, K)  # columns k
    return acc + tl.dot(x, tl.trans(w.to(x.dtype)), input_precision=PRECISION)


@triton.jit
def _e4m3_rounded(x):
    """fp32 x (|x| <= 448) rounded to the nearest float8 e4m3 value, ties to even: the cast that follows is
    then exact. Triton's interpreter (the CPU tests') casts a value just below a power of two to the power
    below instead of the one above; the GPU's cast rounds right by itself."""
    exponent = tl.maximum(((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # e4m3's smallest normal: 2^-6
    ulp = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits
    # adding 1.5 * 2^23 ulps leaves fp32 itself one ulp of precision: the sum rounds x to whole ulps
    magic = ulp * 12582912.0
    return (x + magic) - magic


@triton.jit
def _quantized_rows(x, EXACT_CAST: tl.constexpr):
    """Each row of x [ROWS, BLOCK_K] as float8 e4m3 values and the fp32 scale that restores them (its largest
    magnitude / 448; 1 for a row of zeros): [ROWS, BLOCK_K], [ROWS]."""
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.where(amax > 0, amax / FP8_MAX, 1.0)
    q = x / scale[:, None]
    if EXACT_CAST:
        q = _e4m3_rounded(q)
    return q.to(tl.float8e4nv), scale


@triton.jit
def _block_scaled_dot(
    acc, xq, x_scale, w_ptr, scale_ptr, first, features, feature_ok, start, columns, K, SCALE_ROWS, SCALE_COLUMNS
):
    """acc + x W[features, start:start + BLOCK_K]^T: [ROWS, BLOCK_N], on the FP8 tensor cores, x given as
    float8 rows xq [ROWS, BLOCK_K] with their scales x_scale [ROWS]; `first` is features[0], and the
    chunk lies in one block of W's scales."""
    w = _weight_chunk(w_ptr, features, feature_ok, start, columns, K)
    w_scale = tl.load(scale_ptr + first // SCALE_ROWS * tl.cdiv(K, SCALE_COLUMNS) + start // SCALE_COLUMNS)
    return acc + tl.dot(xq, tl.trans(w)) * (x_scale * w_scale)[:, None]


@triton.jit
def _rows_sums(acc, rstd, scale_ptr, bias_ptr, features, feature_ok, SCALES: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The products of a tile, [ROWS, BLOCK_N] fp32, scaled by each row's 1/rms (`rstd` [ROWS]) and each
    feature's FP8 scale (PER_ROW), plus the bias."""
    acc *= rstd[:, None]
    if SCALES == PER_ROW:
        acc *= tl.load(scale_ptr + features, mask=feature_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + features, mask=feature_ok, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _rows_kernel(
    x_ptr,
    r_ptr,
    g_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    y_ptr,
    h_ptr,
    M,
    N,
    K,
    stride_x,
    stride_y,
    eps,
    PROLOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GATED_OUTPUT: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    SCALE_COLUMNS: tl.constexpr,
    PRECISION: tl.constexpr,
    EXACT_CAST: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SUM_BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    rows = tl.arange(0, ROWS)
    row_ok = rows < M
    first = tl.program_id(0) * BLOCK_N
    features = first + tl.arange(0, BLOCK_N)  # of y; with GATED_OUTPUT, of the gate, and N + them of the up
    feature_ok = features < N
    columns = tl.arange(0, BLOCK_K)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    squares = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
    wait_for_previous_kernel(PDL, False)  # the next kernel starts after the loop
    a_next, r_next = _rows_loads(x_ptr, r_ptr, rows, row_ok, columns, K, stride_x, HAS_RESIDUAL)
    for start in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k = start + columns
        if PROLOGUE == RMS_NORM:
            # the inputs loaded a chunk ahead by hand: given the sums of squares, the pipeliner leaves the
            # loads of W unpipelined, and the product takes far longer than a plain one
            a, r = a_next, r_next
            a_next, r_next = _rows_loads(x_ptr, r_ptr, rows, row_ok, k + BLOCK_K, K, stride_x, HAS_RESIDUAL)
            x, h = _rows_normed(a, r, g_ptr, k, K, HAS_RESIDUAL)
            squares += h * h
        else:
            x = _rows_loads(x_ptr, r_ptr, rows, row_ok, k, K, stride_x, False)[0]
        # x: [ROWS, BLOCK_K] with W[features, k]: [BLOCK_N, BLOCK_K] -> acc [ROWS, BLOCK_N]
        if SCALES == PER_BLOCK:
            xq, x_scale = _quantized_rows(x, EXACT_CAST)
            acc = _block_scaled_dot(
                acc,
                xq,
                x_scale,
                w_ptr,
                scale_ptr,
                first,
                features,
                feature_ok,
                start,
                columns,
                K,
                SCALE_ROWS,
                SCALE_COLUMNS,
            )
            if GATED_OUTPUT:
                up = _block_scaled_dot(
                    up,
                    xq,
                    x_scale,
                    w_ptr,
                    scale_ptr,
                    N + first,
                    N + features,
                    feature_ok,
                    start,
                    columns,
                    K,
                    SCALE_ROWS,
                    SCALE_COLUMNS,
                )
        else:
            acc = _rows_dot(acc, x, w_ptr, features, feature_ok, k, K, PRECISION)
            if GATED_OUTPUT:
                up = _rows_dot(up, x, w_ptr, N + features, feature_ok, k, K, PRECISION)
    let_next_kernel_start(PDL)
    rstd = tl.full((ROWS,), 1.0, tl.float32)
    if PROLOGUE == RMS_NORM:
        rstd = tl.rsqrt(tl.sum(squares, axis=1) / K + eps)
        if HAS_RESIDUAL:  # apart from the pipelined loop, which a store in it would hold up
            _store_rows_sum(x_ptr, r_ptr, h_ptr, M, K, stride_x, ROWS, SUM_BLOCK)
    y = _rows_sums(acc, rstd, scale_ptr, bias_ptr, features, feature_ok, SCALES, HAS_BIAS)
    if GATED_OUTPUT:  # act(gate) * up of the product's values rounded to the dtype, as in two kernels
        up = _rows_sums(up, rstd, scale_ptr, bias_ptr, N + features, feature_ok, SCALES, HAS_BIAS)
        y = gated(y.to(y_ptr.dtype.element_ty), up.to(y_ptr.dtype.element_ty), ACT)
    at = rows[:, None].to(tl.int64) * stride_y + features[None, :]
    tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & feature_ok[None, :])


def _scale_layout(
    weight: torch.Tensor, weight_scale: torch.Tensor | None, weight_block: tuple[int, int] | None
) -> tuple[tl.constexpr, int, int]:
    """SCALES, SCALE_ROWS and SCALE_COLUMNS for a weight: full precision, FP8 per output row, or FP8 per block."""
    if weight_scale is None:
        return NO_SCALES, 1, 1
    assert weight_scale.dtype == torch.float32 and weight_scale.is_contiguous()
    rows, columns = weight_block
    if rows == 1 and columns == weight.size(1):
        return PER_ROW, 1, 1
    return PER_BLOCK, rows, columns


def _output(x: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    """Where a product of x's rows with n features goes: `out` (rows of it may lie apart), else a new tensor."""
    if out is None:
        return torch.empty(x.size(0), n, dtype=x.dtype, device=x.device)
    assert out.shape == (x.size(0), n) and out.dtype == x.dtype and out.stride(1) == 1
    return out


def _launch(
    a: torch.Tensor,
    weight: torch.Tensor,
    prologue: tl.constexpr,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    act: tl.constexpr = SILU,
    weight_scale: torch.Tensor | None = None,
    weight_block: tuple[int, int] | None = None,
    ranks_sum: ProductSum | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    n, k = weight.shape
    assert a.size(0) == 1 and a.stride(1) == 1 and weight.is_contiguous()
    scales, scale_rows, scale_columns = _scale_layout(weight, weight_scale, weight_block)
    y = _output(a, n, out)
    h = torch.empty(1, k, dtype=a.dtype, device=a.device) if residual is not None else None
    fp8 = scales != NO_SCALES
    block_n, block_k, num_warps = blocks_for(prologue, n, k, fp8, ranks_sum is not None)
    word = FP8_WORD if fp8 and k % FP8_WORD == 0 else 1  # int32 words where the rows are whole words
    vec = FP8_VEC if fp8 else 1
    block_k = max(vec, min(block_k, triton.next_power_of_2(k)))
    # a program's features in one block of rows, and each group of a thread's columns in one block of columns
    assert scales != PER_BLOCK or scale_rows % block_n == 0 and scale_columns % vec == 0
    assert ranks_sum is None or (ranks_sum.takes(n) and block_n in ranks_sum.lanes)
    lanes, abort, rank = (y, y, 0) if ranks_sum is None else (ranks_sum.lanes[block_n], ranks_sum.abort, ranks_sum.rank)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        a,
        residual if residual is not None else a,
        norm_weight if norm_weight is not None else a,
        weight.view(torch.int32) if word > 1 else weight,
        weight_scale if weight_scale is not None else a,
        bias if bias is not None else weight,
        y,
        h if h is not None else y,
        n,
        k,
        eps,
        lanes,
        abort,
        rank,
        PROLOGUE=prologue.value,
        HAS_RESIDUAL=residual is not None,
        ACT=act.value,
        HAS_BIAS=bias is not None,
        SCALES=scales,
        SCALE_ROWS=scale_rows,
        SCALE_COLUMNS=scale_columns,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        WORD=word,
        VEC=vec,
        PTX=compiled_for_gpu(a.device),
        SUM_RANKS=ranks_sum is not None,
        WORLD=lanes.numel() if ranks_sum is not None else 1,
        THREADS=32 * num_warps,
        num_warps=num_warps,
        **pdl_launch(a.device),
    )
    return y, h


def _launch_rows(
    x: torch.Tensor,
    weight: torch.Tensor,
    prologue: tl.constexpr = PLAIN,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    act: tl.constexpr | None = None,
    weight_scale: torch.Tensor | None = None,
    weight_block: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    n, k = weight.shape
    assert 2 <= x.size(0) <= MAX_ROWS and x.stride(1) == 1 and weight.is_contiguous()
    assert prologue is PLAIN or x.is_contiguous() and (residual is None or residual.is_contiguous())
    scales, scale_rows, scale_columns = _scale_layout(weight, weight_scale, weight_block)
    block_n, block_k, num_warps, stages = rows_blocks_for(
        n, x.element_size(), scale_columns if scales is PER_BLOCK else None
    )
    if act is not None:  # a program reads as many rows of W as in a plain product: half gate, half up (16 at least)
        n, block_n = n // 2, max(16, block_n // 2)
    y = _output(x, n, out)
    h = torch.empty_like(x) if residual is not None else None
    # a program's features in one block of rows, in the up half too (FP8 blocks never straddle gate and up)
    assert scales != PER_BLOCK or scale_rows % block_n == 0 and (act is None or n % block_n == 0)
    programs = triton.cdiv(n, block_n)
    _rows_kernel[(programs,)](
        x,
        residual if residual is not None else x,
        norm_weight if norm_weight is not None else x,
        weight,
        weight_scale if weight_scale is not None else x,
        bias if bias is not None else weight,
        y,
        h if h is not None else y,
        x.size(0),
        n,
        k,
        x.stride(0),
        y.stride(0),
        eps,
        PROLOGUE=prologue.value,
        HAS_RESIDUAL=residual is not None,
        GATED_OUTPUT=act is not None,
        ACT=(SILU if act is None else act).value,
        HAS_BIAS=bias is not None,
        SCALES=scales,
        SCALE_ROWS=scale_rows,
        SCALE_COLUMNS=scale_columns,
        # float32 inputs (the CPU tests') are multiplied in full precision rather than as TF32
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        EXACT_CAST=x.device.type == "cpu",  # CPU tensors run in Triton's interpreter (`_e4m3_rounded`)
        ROWS=MAX_ROWS,
        BLOCK_N=block_n,
        BLOCK_K=min(block_k, max(16, triton.next_power_of_2(k))),
        SUM_BLOCK=max(16, triton.next_power_of_2(triton.cdiv(k, programs))),  # columns of h a program writes
        STAGES=stages,
        num_warps=num_warps,
        **pdl_launch(x.device),
    )
    return y, h


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    weight_block: tuple[int, int] | None = None,
    ranks_sum: ProductSum | None = None,
) -> torch.Tensor:
    """x @ weight^T (+ bias) for 1 to MAX_ROWS rows x, written to `out` when given; an FP8 weight with its
    `weight_scale` per `weight_block`. With `ranks_sum` (one row), x @ weight^T is this rank's part of a sum
    over the tensor-parallel ranks, and the launch writes the sum."""
    # x: [M, K]; weight: [N, K]; bias: [N] -> [M, N]
    assert x.size(1) == weight.size(1)
    fp8 = dict(weight_scale=weight_scale, weight_block=weight_block)
    if x.size(0) > 1:
        assert ranks_sum is None
        return _launch_rows(x, weight, PLAIN, out=out, bias=bias, **fp8)[0]
    return _launch(x, weight, PLAIN, out=out, bias=bias, ranks_sum=ranks_sum, **fp8)[0]


def rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    weight_block: tuple[int, int] | None = None,
    hidden_act: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm(x + residual) @ weight^T (+ bias) for 1 to MAX_ROWS rows, and x + residual (x itself without a
    residual): a pre-norm block's norm and first projection in one launch. With `hidden_act` (2 rows or
    more; a key of `triton_gated_activation.ACTIVATIONS`) the weight is gate | up and the launch writes
    act(gate) * up of the product: an MLP's norm, first projection and activation. An FP8 weight as for `gemv`."""
    # x, residual: [M, K]; norm_weight: [K]; weight: [N, K]; bias: [N] -> [M, N] (N / 2 with hidden_act), [M, K]
    assert x.size(1) == weight.size(1) and (residual is None or residual.is_contiguous())
    fp8 = dict(weight_scale=weight_scale, weight_block=weight_block)
    if x.size(0) > 1:
        act = None if hidden_act is None else ACTIVATIONS[hidden_act]
        y, h = _launch_rows(x, weight, RMS_NORM, residual, norm_weight, eps, bias=bias, act=act, **fp8)
    else:
        assert hidden_act is None  # one row reads the activation in the down projection's GEMV instead
        y, h = _launch(x, weight, RMS_NORM, residual, norm_weight, eps, bias=bias, **fp8)
    return y, x if h is None else h


def gated_gemv(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    hidden_act: str,
    bias: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    weight_block: tuple[int, int] | None = None,
    ranks_sum: ProductSum | None = None,
) -> torch.Tensor:
    """(act(gate) * up) @ weight^T (+ bias) for a single row gate_up = gate | up, act being `hidden_act`
    (a key of `triton_gated_activation.ACTIVATIONS`): an MLP's activation and down projection in one launch.
    An FP8 weight and `ranks_sum` as for `gemv`."""
    # gate_up: [1, 2K]; weight: [N, K]; bias: [N] -> [1, N]
    assert gate_up.shape == (1, 2 * weight.size(1))
    fp8 = dict(weight_scale=weight_scale, weight_block=weight_block)
    return _launch(gate_up, weight, GATED, bias=bias, act=ACTIVATIONS[hidden_act], ranks_sum=ranks_sum, **fp8)[0]
