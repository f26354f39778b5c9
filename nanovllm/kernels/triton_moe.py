"""Triton kernels: a mixture-of-experts layer's experts as two grouped GEMMs over block-aligned runs of tokens.

Inputs: x [tokens, hidden]; w13 [experts, 2I, hidden] (each expert's gate rows,
then its up rows); w2 [experts, hidden, I]; the routing's weights and ids
[tokens, top_k]. Token t's j-th choice is slot p = t * top_k + j.

1. `triton_moe_align.align_by_expert`: the slots in runs of one expert, each
   padded to whole blocks of BLOCK_M rows; sorted_slots holds the slot of
   each row (P = tokens * top_k for a padding row), block_experts the expert
   of each block. Shapes depend only on the token count.
2. `_gate_up_kernel`, one program per (block, BLOCK_N columns of I): it
   multiplies its block's tokens (gathered rows of x) by BLOCK_N columns of
   its expert's gate and the same of its up, and writes act(gate) * up for
   those columns: h [rows, I]. Blocks past the last expert's run return at once.
3. `_down_kernel`, one program per (block, BLOCK_N columns of hidden): h's
   rows times the expert's down, each row scaled by its slot's routing
   weight, written at the slot: out [P, hidden]; a token's top_k rows are then
   summed.

Programs are numbered column tile first, so the tiles of one block run side
by side and read its gathered rows from L2 rather than from memory each, and
the blocks of one expert run close together and share its weights in L2.

MXFP4 experts (`MXFP4`, gpt-oss: w13 [experts, 2I, hidden / 2] and w2
[experts, hidden, I / 2] uint8 with their blocks' scales) are read as stored,
4.25 bits a weight: each chunk of BLOCK_K inputs is BLOCK_K / 2 bytes and
BLOCK_K / 32 scales of each column, which `triton_mxfp4.scaled_dot` multiplies
by the rows (on a GPU, with Triton's scaled dot).

A one-token step reads only its top_k experts' weights: the other experts own
no block. Up to FEW_TOKENS tokens (MXFP4_FEW_TOKENS of MXFP4 experts) skip all
of this for `triton_moe_gemv.py`.
Roundings follow the PyTorch path (`layers/fused_moe.moe_experts`): gate, up
and down rounded to the model's dtype, the activation as
`triton_gated_activation` computes it, each weighted choice rounded to the
dtype and the choices summed in fp32. Tile sizes by token count come from
`TILES`, which `benchmarks/moe.py --sweep` measures.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_gated_activation import ACTIVATIONS, gated
from nanovllm.kernels.triton_moe_align import align_by_expert
from nanovllm.kernels.triton_moe_gemv import few_token_experts
from nanovllm.kernels.triton_mxfp4 import scaled_dot

# up to this many tokens, each choice reads its expert's rows directly (`triton_moe_gemv.py`): blocks of
# 16 rows would be nearly all padding; past it the grouped GEMMs win (docs/tuning.md). MXFP4 experts cross
# over sooner: each choice decodes its expert's bytes again on the CUDA cores, where a grouped GEMM's block
# decodes them once for its rows, inside the tensor cores' scaled dot
FEW_TOKENS = 12
MXFP4_FEW_TOKENS = 4

# the fewest tokens each row applies from -> (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the fastest
# of `benchmarks/moe.py --sweep` on a Qwen3-30B-A3B layer
TILES = {
    1: (16, 32, 128, 4, 3),
    64: (16, 128, 128, 4, 3),
    256: (32, 64, 128, 4, 3),
    1024: (64, 64, 64, 4, 3),
    2048: (128, 128, 64, 8, 3),
}
# MXFP4 experts where another row is faster: a gpt-oss-20b layer (`benchmarks/moe.py --shape gpt-oss-20b-mxfp4`)
MXFP4_TILES = {**TILES, 64: (16, 64, 128, 4, 3), 256: (64, 64, 128, 4, 3)}


def tiles_for(num_tokens: int, mxfp4: bool = False) -> tuple[int, int, int, int, int]:
    """The tile sizes and launch settings for a batch of `num_tokens` tokens (of MXFP4 experts or not)."""
    tiles = MXFP4_TILES if mxfp4 else TILES
    return tiles[max(n for n in tiles if n <= max(num_tokens, 1))]


@triton.jit
def _program_tile(num_columns, BLOCK_N: tl.constexpr):
    """This program's block and its first output column: the column tiles of a block are consecutive
    programs."""
    tiles = tl.cdiv(num_columns, BLOCK_N)
    return tl.program_id(0) // tiles, tl.program_id(0) % tiles * BLOCK_N


@triton.jit
def _block_rows(sorted_slots_ptr, block_experts_ptr, block, num_slots, BLOCK_M: tl.constexpr):
    """Block `block`: its expert, its rows [BLOCK_M], their slots, and which rows hold a slot (the
    others pad the expert's run)."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_slots_ptr + rows)
    return tl.load(block_experts_ptr + block).to(tl.int64), rows, slots, slots < num_slots


@triton.jit
def _dense_products(
    a_rows,
    w_cols,
    row_ok,
    n_ok,
    K,
    stride_wn,
    TWO: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """a . w over K inputs ([BLOCK_M, BLOCK_N] fp32) for a's rows from `a_rows` [BLOCK_M, 1] and w's columns
    from `w_cols` [1, BLOCK_N]; with TWO also a . w' for the columns w' stride_wn * (K's other half) on: the
    gate's and the up's products from one read of a."""
    k = tl.arange(0, BLOCK_K)
    a_rows = a_rows + k[None, :]  # [BLOCK_M, BLOCK_K]
    w_cols = w_cols + k[:, None]  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k_ok = k + start < K
        a = tl.load(a_rows + start, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & n_ok[None, :]
        acc = tl.dot(a, tl.load(w_cols + start, mask=w_mask, other=0.0), acc, input_precision=PRECISION)
        if TWO:
            w2 = tl.load(w_cols + stride_wn + start, mask=w_mask, other=0.0)
            acc2 = tl.dot(a, w2, acc2, input_precision=PRECISION)
    return acc, acc2


@triton.jit
def _mxfp4_products(
    a_rows,
    w_values,
    w_scales,
    row_ok,
    n_ok,
    K,
    stride_wn,
    stride_sn,
    TWO: tl.constexpr,
    NATIVE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """`_dense_products` of MXFP4 columns: their bytes from `w_values` and their blocks' scales from
    `w_scales` ([1, BLOCK_N] each, at each column's start; with TWO the other columns stride_wn and stride_sn
    on), a chunk of BLOCK_K inputs being BLOCK_K / 2 bytes and BLOCK_K / 32 scales of each column (BLOCK_K a
    multiple of 32: whole blocks), multiplied by `triton_mxfp4.scaled_dot`."""
    k = tl.arange(0, BLOCK_K)
    b = tl.arange(0, BLOCK_K // 2)  # byte b of a chunk holds its inputs 2b and 2b + 1
    g = tl.arange(0, BLOCK_K // 32)  # the chunk's blocks
    a_rows = a_rows + k[None, :]  # [BLOCK_M, BLOCK_K]
    w_values = w_values + b[:, None]  # [BLOCK_K / 2, BLOCK_N]
    w_scales = tl.trans(w_scales) + g[None, :]  # [BLOCK_N, BLOCK_K / 32]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        a = tl.load(a_rows + start, mask=row_ok[:, None] & (k + start < K)[None, :], other=0.0)
        values_mask = (b + start // 2 < K // 2)[:, None] & n_ok[None, :]
        scales_mask = n_ok[:, None] & (g + start // 32 < K // 32)[None, :]
        values, scales = w_values + start // 2, w_scales + start // 32
        acc = scaled_dot(
            a,
            tl.load(values, mask=values_mask, other=0),
            tl.load(scales, mask=scales_mask, other=0),
            acc,
            NATIVE,
            PRECISION,
        )
        if TWO:
            acc2 = scaled_dot(
                a,
                tl.load(values + stride_wn, mask=values_mask, other=0),
                tl.load(scales + stride_sn, mask=scales_mask, other=0),
                acc2,
                NATIVE,
                PRECISION,
            )
    return acc, acc2


@triton.jit(do_not_specialize=["num_slots"])  # one compile for every token count
def _gate_up_kernel(
    x_ptr,
    w13_ptr,
    s13_ptr,
    b13_ptr,
    h_ptr,
    sorted_slots_ptr,
    block_experts_ptr,
    num_rows_ptr,
    num_slots,
    I,
    H,
    stride_xt,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_hr,
    stride_be,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr,
    NATIVE_MXFP4: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block, first_column = _program_tile(I, BLOCK_N)
    if block * BLOCK_M >= tl.load(num_rows_ptr):  # past the last expert's run
        return
    expert, rows, slots, row_ok = _block_rows(sorted_slots_ptr, block_experts_ptr, block, num_slots, BLOCK_M)
    tokens = (slots // TOP_K).to(tl.int64)
    n = first_column + tl.arange(0, BLOCK_N)
    n_ok = n < I
    x_rows = x_ptr + tokens[:, None] * stride_xt  # [BLOCK_M, 1]
    columns = n[None, :].to(tl.int64)  # [1, BLOCK_N]: of the gate; the up's are I rows of w13 on
    if MXFP4:
        values = w13_ptr + expert * stride_we + columns * stride_wn
        scales = s13_ptr + expert * stride_se + columns * stride_sn
        gate, up = _mxfp4_products(
            x_rows,
            values,
            scales,
            row_ok,
            n_ok,
            H,
            I * stride_wn,
            I * stride_sn,
            True,
            NATIVE_MXFP4,
            PRECISION,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        w_cols = w13_ptr + expert * stride_we + columns * stride_wn
        gate, up = _dense_products(
            x_rows, w_cols, row_ok, n_ok, H, I * stride_wn, True, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K
        )
    if HAS_BIAS:  # added to the fp32 sums, as the projection adds it before rounding
        biases = b13_ptr + expert * stride_be + n
        gate += tl.load(biases, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        up += tl.load(biases + I, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    dtype = h_ptr.dtype.element_ty
    # gate and up rounded as the projection's output is, then the activation rounded once
    h = gated(gate.to(dtype), up.to(dtype), ACT).to(dtype)
    tl.store(h_ptr + rows[:, None] * stride_hr + n[None, :], h, mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["num_slots"])  # one compile for every token count
def _down_kernel(
    h_ptr,
    w2_ptr,
    s2_ptr,
    b2_ptr,
    out_ptr,
    weights_ptr,
    sorted_slots_ptr,
    block_experts_ptr,
    num_rows_ptr,
    num_slots,
    I,
    H,
    stride_hr,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_os,
    stride_be,
    HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr,
    NATIVE_MXFP4: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block, first_column = _program_tile(H, BLOCK_N)
    if block * BLOCK_M >= tl.load(num_rows_ptr):  # past the last expert's run
        return
    expert, rows, slots, row_ok = _block_rows(sorted_slots_ptr, block_experts_ptr, block, num_slots, BLOCK_M)
    n = first_column + tl.arange(0, BLOCK_N)
    n_ok = n < H
    h_rows = h_ptr + rows[:, None].to(tl.int64) * stride_hr  # [BLOCK_M, 1]
    columns = n[None, :].to(tl.int64)  # [1, BLOCK_N]
    if MXFP4:
        values = w2_ptr + expert * stride_we + columns * stride_wn
        scales = s2_ptr + expert * stride_se + columns * stride_sn
        acc, _ = _mxfp4_products(
            h_rows, values, scales, row_ok, n_ok, I, 0, 0, False, NATIVE_MXFP4, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K
        )
    else:
        w_cols = w2_ptr + expert * stride_we + columns * stride_wn
        acc, _ = _dense_products(h_rows, w_cols, row_ok, n_ok, I, 0, False, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        acc += tl.load(b2_ptr + expert * stride_be + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    weight = tl.load(weights_ptr + slots, mask=row_ok, other=0.0)  # fp32 [BLOCK_M]
    dtype = h_ptr.dtype.element_ty
    y = (acc.to(dtype).to(tl.float32) * weight[:, None]).to(dtype)
    tl.store(out_ptr + slots[:, None].to(tl.int64) * stride_os + n[None, :], y, mask=row_ok[:, None] & n_ok[None, :])


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    hidden_act: str,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """For each token, the sum over its top_k choices of weight * down(act(gate(x)) * up(x)) of that
    expert (each projection adding its bias, where given), as `layers/fused_moe.moe_experts` computes it,
    in two grouped-GEMM launches (or, up to FEW_TOKENS tokens, two launches that read each choice's expert
    directly). `norm_weight` (few tokens only): x is RMS-normalised first, inside the gate/up kernel
    (`few_token_experts`).

    x: [tokens, hidden]; w13: [experts, 2I, hidden]; w2: [experts, hidden, I]; w13_bias: [experts, 2I];
    w2_bias: [experts, hidden]; weights (fp32), ids: [tokens, top_k]; norm_weight: [hidden]
    -> [tokens, hidden] in x's dtype
    """
    num_tokens, hidden = x.shape
    mxfp4 = w13_scale is not None
    num_experts, width = w2.size(0), w2.size(2) * (2 if mxfp4 else 1)
    top_k = ids.size(1)
    assert x.stride(1) == 1 and w13.is_contiguous() and w2.is_contiguous() and weights.dtype == torch.float32
    if num_tokens <= (MXFP4_FEW_TOKENS if mxfp4 else FEW_TOKENS):
        scales = dict(w13_scale=w13_scale, w2_scale=w2_scale)
        return few_token_experts(x, w13, w2, weights, ids, hidden_act, norm_weight, eps, w13_bias, w2_bias, **scales)
    assert norm_weight is None, "only the few-token kernels normalise their input"
    block_m, block_n, block_k, num_warps, num_stages = tiles_for(num_tokens, mxfp4)
    if x.dtype == torch.float32:  # tiles of twice the bytes: fewer in flight, or they overflow shared memory
        block_k, num_stages = min(block_k, 32), 2
    sorted_slots, block_experts, num_rows = align_by_expert(ids, num_experts, block_m)
    num_slots, blocks = num_tokens * top_k, block_experts.numel()
    launch = dict(
        # fp32 models multiply in full fp32, as the PyTorch path does, not in TF32
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        # `triton_mxfp4.scaled_dot`: Triton's scaled dot on a GPU, for the bf16 rows it takes
        NATIVE_MXFP4=x.is_cuda and x.dtype == torch.bfloat16,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    h = torch.empty(sorted_slots.numel(), width, dtype=x.dtype, device=x.device)  # [rows, I]
    has_bias = w13_bias is not None
    if not has_bias:  # never read: the bias is compiled out
        w13_bias = w2_bias = weights
    if not mxfp4:  # never read: the scales are compiled out
        w13_scale, w2_scale = w13, w2
    _gate_up_kernel[(blocks * triton.cdiv(width, block_n),)](
        x,
        w13,
        w13_scale,
        w13_bias,
        h,
        sorted_slots,
        block_experts,
        num_rows,
        num_slots,
        width,
        hidden,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        w13_scale.stride(0),
        w13_scale.stride(1),
        h.stride(0),
        w13_bias.stride(0),
        TOP_K=top_k,
        ACT=ACTIVATIONS[hidden_act],
        HAS_BIAS=has_bias,
        MXFP4=mxfp4,
        **launch,
    )
    out = torch.empty(num_slots, hidden, dtype=x.dtype, device=x.device)  # [slots, hidden]
    _down_kernel[(blocks * triton.cdiv(hidden, block_n),)](
        h,
        w2,
        w2_scale,
        w2_bias,
        out,
        weights,
        sorted_slots,
        block_experts,
        num_rows,
        num_slots,
        width,
        hidden,
        h.stride(0),
        w2.stride(0),
        w2.stride(1),
        w2_scale.stride(0),
        w2_scale.stride(1),
        out.stride(0),
        w2_bias.stride(0),
        HAS_BIAS=has_bias,
        MXFP4=mxfp4,
        **launch,
    )
    return out.view(num_tokens, top_k, hidden).sum(dim=1)  # summed in fp32, rounded once
