"""Triton kernels: products of many rows (prefill) with block-FP8 weights on FP8 tensor cores.

The weight W [N, K] is float8_e4m3fn with one fp32 scale per 128 x 128 block, w_scale [ceil(N/128),
ceil(K/128)] (`fp8_weights.py` has the format; block-FP8 checkpoints such as Qwen3-*-FP8). x is
quantized per token and per group of 128 columns (`quantize_groups`): x_q [M, K] fp8 and x_scale [M,
ceil(K/128)], so that each 128-column step of the product multiplies two float8 tiles that carry one
scale each along K. The arithmetic is `fp8_weights.fp8_linear`'s (quantize_x=True) up to the order of
the fp32 sums.

`_quantize_kernel`, grid (M, cdiv(groups, GROUPS)): a program reads GROUPS groups of one row, takes each
group's amax, divides by amax / 448 (1 for an all-zero group) with IEEE division and rounds to float8's
grid, ties to even, as PyTorch's cast does (by hand, `_round_to_e4m3`, so that the interpreter rounds
alike): its values and scales equal the reference's bit for bit. x_scale
is written column-major (a view of [M, groups] with strides (1, M)), so that the GEMM reads the scales of
its BLOCK_M rows for one group as one contiguous run.

`_gemm_kernel`, grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),), launched in groups of GROUP_M row tiles
that sweep the column tiles together (a tile of W is read by GROUP_M programs close in time, from L2).
A program owns a BLOCK_M x BLOCK_N tile of y and walks K in steps of BLOCK_K = 128, one scale group:
each step is one tl.dot of the two float8 tiles (fp32 result), scaled by the rows' x scales and the
features' W scales and added to an fp32 accumulator; the bias is added and y rounded to its dtype once
at the end. Adding each step's product in fp32 also bounds what Hopper's FP8 MMA sums at reduced
precision to 128 products. Features may span several blocks of W's rows (BLOCK_N > 128): each
feature's scale is read for itself.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.fp8_kv import FP8_DTYPE, FP8_MAX

BLOCK = (128, 128)  # the weight block one scale covers: the only layout the product takes
GROUP_K = BLOCK[1]  # columns of x per scale, and the product's step along K
_QUANTIZE_GROUPS = 8  # groups of a row one quantizing program reads: 1024 values
# (most rows, (BLOCK_M, BLOCK_N, stages, warps)), first match: Hopper FP8 practice to start from, not yet
# swept. Few rows take 64-row tiles (one warpgroup's MMA height) and narrower columns, so that enough
# programs cover the SMs; many rows the 128 x 128 tile (32 KiB a stage, 4 stages in shared memory).
GEMM_BLOCKS = ((64, (64, 64, 4, 4)), (256, (64, 128, 4, 4)), (None, (128, 128, 4, 8)))
GROUP_M = 8  # row tiles per group of the launch order


def gemm_blocks_for(m: int) -> tuple[int, int, int, int]:
    """BLOCK_M, BLOCK_N, pipeline stages and warps of the product of m rows."""
    for most_rows, blocks in GEMM_BLOCKS:
        if most_rows is None or m <= most_rows:
            return blocks
    raise AssertionError("GEMM_BLOCKS ends with a catch-all entry")


@triton.jit
def _round_to_e4m3(v):
    """v (fp32, |v| <= 448) rounded to the nearest float8 e4m3 value, ties to even, still in fp32. A value
    on e4m3's grid converts to float8 exactly, where the interpreter's own rounding (half up, without the
    carry into the exponent) would differ from PyTorch's."""
    magnitude = tl.abs(v)
    # the binade's spacing 2^(exponent - 3) (3 mantissa bits); subnormals share the smallest binade's, 2^-9
    exponent = tl.maximum((magnitude.to(tl.int32, bitcast=True) >> 23) - 127, -6)
    spacing = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    steps = magnitude * ((3 - exponent + 127) << 23).to(tl.float32, bitcast=True)  # exact: a power of 2
    nearest = tl.floor(steps + 0.5)
    odd = nearest - 2.0 * tl.floor(nearest * 0.5) == 1.0
    nearest = tl.where((nearest - steps == 0.5) & odd, nearest - 1.0, nearest)
    # v's sign bit put back (-x would be 0 - x, which turns -0.0 into 0.0), as PyTorch's conversion keeps it
    sign = v.to(tl.uint32, bitcast=True) & 0x80000000
    return ((nearest * spacing).to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_kernel(
    x_ptr, q_ptr, scale_ptr, M, K, stride_x, GROUPS: tl.constexpr, GROUP: tl.constexpr, MAX: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    k = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [GROUPS, GROUP]
    k_ok = k < K
    x = tl.load(x_ptr + row * stride_x + k, mask=k_ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    # IEEE divisions (Triton's `/` is an approximate one on the GPU): the reference's values bit for bit
    scale = tl.where(amax > 0, tl.math.div_rn(amax, tl.full(amax.shape, MAX, tl.float32)), 1.0)
    q = tl.math.div_rn(x, tl.broadcast_to(scale[:, None], x.shape))
    tl.store(q_ptr + row * K + k, _round_to_e4m3(q).to(q_ptr.dtype.element_ty), mask=k_ok)
    tl.store(scale_ptr + groups.to(tl.int64) * M + row, scale, mask=groups * GROUP < K)


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as float8 values and one fp32 scale per token and group of 128 columns, amax / 448 (1 for an
    all-zero group): `fp8_weights.quantize_blocks(x, (1, 128))`, bit for bit. The scales are a
    column-major view, as the GEMM reads them."""
    # x: [M, K] -> [M, K] fp8, scales [M, ceil(K / 128)] fp32 (strides (1, M))
    m, k = x.shape
    assert x.stride(1) == 1
    groups = triton.cdiv(k, GROUP_K)
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(groups, m, dtype=torch.float32, device=x.device).t()
    if m and k:
        grid = (m, triton.cdiv(groups, _QUANTIZE_GROUPS))
        _quantize_kernel[grid](x, q, scale, m, k, x.stride(0), GROUPS=_QUANTIZE_GROUPS, GROUP=GROUP_K, MAX=FP8_MAX)
    return q, scale


@triton.jit
def _gemm_kernel(
    x_ptr,
    x_scale_ptr,
    w_ptr,
    w_scale_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_x,
    stride_x_scale_m,
    stride_x_scale_g,
    stride_w,
    stride_w_scale,
    stride_y,
    SCALE_ROWS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    STAGES: tl.constexpr,
):
    # program -> tile: GROUP_M row tiles take the column tiles in turn, so that each tile of W is read
    # from memory once per group rather than once per row tile
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % group_rows
    tile_n = (pid % per_group) // group_rows

    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    features = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    columns = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    feature_ok = features < N
    x_at = x_ptr + rows[:, None].to(tl.int64) * stride_x + columns[None, :]  # [BLOCK_M, BLOCK_K]
    w_at = w_ptr + features[:, None].to(tl.int64) * stride_w + columns[None, :]  # [BLOCK_N, BLOCK_K]
    x_scale_at = x_scale_ptr + rows.to(tl.int64) * stride_x_scale_m  # [BLOCK_M]
    w_scale_at = w_scale_ptr + (features // SCALE_ROWS).to(tl.int64) * stride_w_scale  # [BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for group in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        start = group * BLOCK_K
        k_ok = start + columns < K
        x = tl.load(x_at + start, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_at + start, mask=feature_ok[:, None] & k_ok[None, :], other=0.0)
        x_scale = tl.load(x_scale_at + group * stride_x_scale_g, mask=row_ok, other=0.0)
        w_scale = tl.load(w_scale_at + group, mask=feature_ok, other=0.0)
        # x: [BLOCK_M, BLOCK_K] fp8 with W^T: [BLOCK_K, BLOCK_N] fp8 (K-major, as FP8 MMAs take it) -> fp32
        acc += tl.dot(x, tl.trans(w)) * x_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + features, mask=feature_ok, other=0.0).to(tl.float32)[None, :]
    y_at = y_ptr + rows[:, None].to(tl.int64) * stride_y + features[None, :]
    tl.store(y_at, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & feature_ok[None, :])


def block_fp8_gemm(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """x W^T (+ b) of float8 x with one scale per token and group of 128 columns (`quantize_groups`) and
    float8 W with one per 128 x 128 block: fp32 sums, rounded once to `out_dtype`.

    x_q: [M, K] fp8; x_scale: [M, ceil(K / 128)] fp32 (any strides); weight: [N, K] fp8;
    weight_scale: [ceil(N / 128), ceil(K / 128)] fp32; bias: [N] -> [M, N] in out_dtype
    """
    m, k = x_q.shape
    n = weight.size(0)
    groups = triton.cdiv(k, GROUP_K)
    assert weight.size(1) == k and x_q.stride(1) == 1 and weight.stride(1) == 1
    assert x_scale.shape == (m, groups) and weight_scale.shape == (triton.cdiv(n, BLOCK[0]), groups)
    assert weight_scale.stride(1) == 1 and x_scale.dtype == weight_scale.dtype == torch.float32
    y = torch.empty(m, n, dtype=out_dtype, device=x_q.device)
    if m == 0 or n == 0:
        return y
    block_m, block_n, stages, warps = gemm_blocks_for(m)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _gemm_kernel[grid](
        x_q,
        x_scale,
        weight,
        weight_scale,
        bias if bias is not None else weight_scale,
        y,
        m,
        n,
        k,
        x_q.stride(0),
        x_scale.stride(0),
        x_scale.stride(1),
        weight.stride(0),
        weight_scale.stride(0),
        y.stride(0),
        SCALE_ROWS=BLOCK[0],
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=GROUP_K,
        GROUP_M=GROUP_M,
        STAGES=stages,
        num_warps=warps,
    )
    return y


def block_fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x W^T (+ b) for W float8 with one scale per 128 x 128 block, x quantized per token and group of 128
    columns: `fp8_weights.fp8_linear(x, weight, weight_scale, (128, 128), bias)` on FP8 tensor cores.

    x: [tokens, K]; weight: [N, K] fp8; weight_scale: [ceil(N / 128), ceil(K / 128)] fp32; bias: [N]
    -> [tokens, N] in x's dtype
    """
    x_q, x_scale = quantize_groups(x)  # [tokens, K] fp8, [tokens, ceil(K / 128)] fp32
    return block_fp8_gemm(x_q, x_scale, weight, weight_scale, bias, out_dtype=x.dtype)
