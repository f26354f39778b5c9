"""Triton kernels: the experts of a few tokens (a small decode step), straight from the routing.

A decode step of a few sequences gives each expert at most a token or two, so
the grouped GEMMs of `triton_moe.py` would multiply blocks of 16 rows that
are almost all padding, after a chain of small launches that align the
tokens by expert. Here nothing is aligned: slot p = t * top_k + j (token t's
j-th choice) reads its expert ids[p] straight from the routing, and each
program streams BLOCK_N rows of expert weights once, multiplying them with
the inputs (which stay in cache) on the CUDA cores and summing in fp32, as
the one-row GEMV (`triton_gemv.py`) does.

1. `_slot_gate_up_kernel`, grid (slots, cdiv(I, BLOCK_N)): h [slots, I] =
   act(gate . x_t) * (up . x_t) for BLOCK_N features of the slot's expert.
   With NORM, x_t is first RMS-normalised (weight g): the program sums the
   products with g * x_t and x_t's squares in the same pass and scales the
   sums by 1/rms at the end, as the one-row GEMV's RMS_NORM prologue does, so
   that a one-token step runs the layer's norm inside this kernel and the
   router's instead of in a launch of its own.
2. `_token_down_kernel`, grid (tokens, cdiv(hidden, BLOCK_N)): out [tokens,
   hidden] = sum over j of weights[p] * (down . h_p) for BLOCK_N features,
   all top_k choices of the token in one program, so no per-slot output is
   written and summed after.

MXFP4 experts (`MXFP4`, gpt-oss) are read as stored, 4.25 bits a weight:
each chunk of a row is blocks of 16 bytes and one scale each, dequantized in
registers (`triton_mxfp4.py`) into the row's even and odd elements, which
multiply the even and odd inputs.

Both are launched with programmatic dependent launch (`triton_pdl.py`): the
down kernel reads its token's expert ids (written two kernels earlier) and
the first chunk of their weights while the gate/up kernel finishes.
Roundings are those of the PyTorch path (`layers/fused_moe.moe_experts`), as
in `triton_moe.py`.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_gated_activation import ACTIVATIONS, gated
from nanovllm.kernels.triton_mxfp4 import dequantize_pairs
from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel

# (BLOCK_N, BLOCK_K, num_warps): the fastest of a sweep at one token of a Qwen3-30B-A3B layer
_GATE_UP_BLOCKS = (8, 1024, 4)  # 2 x 8 rows of the slot's expert's gate and up per program
_DOWN_BLOCKS = (1, 128, 4)  # a row of each of the token's top_k experts per program
# MXFP4 rows: the fastest of sweeps at one and four tokens of a gpt-oss-20b layer (H200; 77 us a layer at one
# token against 93 with the bf16 rows' down blocks); 8 warps on gate/up to hide the decoding
_MXFP4_GATE_UP_BLOCKS = (8, 512, 8)
_MXFP4_DOWN_BLOCKS = (4, 256, 4)


@triton.jit
def _dense_gate_up_sums(
    x_row, gate_rows, norm_weight_ptr, n_ok, I, H, NORM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    """gate . x and up . x ([BLOCK_N] each, fp32) for the rows of gate from `gate_rows` [BLOCK_N, 1] (those
    of up are I rows on), and the sum of x's squares (with NORM, x is first scaled by the norm's weight)."""
    k = tl.arange(0, BLOCK_K)
    gate_rows = gate_rows + k[None, :]  # [BLOCK_N, BLOCK_K]
    up_rows = gate_rows + I * H
    gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in range(0, H, BLOCK_K):
        k_ok = k + start < H
        x = tl.load(x_row + start + k, mask=k_ok, other=0.0).to(tl.float32)
        if NORM:  # without 1/rms, which is common to every column: the sums are scaled once, at the end
            squares += x * x
            x *= tl.load(norm_weight_ptr + start + k, mask=k_ok, other=0.0).to(tl.float32)
        w_mask = n_ok[:, None] & k_ok[None, :]
        gate += tl.load(gate_rows + start, mask=w_mask, other=0.0).to(tl.float32) * x[None, :]
        up += tl.load(up_rows + start, mask=w_mask, other=0.0).to(tl.float32) * x[None, :]
    return tl.sum(gate, axis=1), tl.sum(up, axis=1), tl.sum(squares, axis=0)


@triton.jit
def _mxfp4_row_products(values, scales, x_even, x_odd, mask):
    """The products of MXFP4 rows' elements with their inputs, [rows, BLOCK_K / 32, 16] fp32: the rows'
    bytes at `values` [rows, BLOCK_K / 32, 16] and their blocks' scales at `scales` [rows, BLOCK_K / 32, 1]
    (one load per block, broadcast over its 16 bytes), the even and odd inputs `x_even`, `x_odd`."""
    even, odd = dequantize_pairs(tl.load(values, mask=mask, other=0), tl.load(scales, mask=mask, other=0))
    return even * x_even + odd * x_odd


@triton.jit
def _mxfp4_gate_up_sums(
    x_row,
    gate_values,
    gate_scales,
    norm_weight_ptr,
    n_ok,
    I,
    H,
    NORM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """`_dense_gate_up_sums` of MXFP4 rows: their bytes from `gate_values` and their blocks' scales from
    `gate_scales` ([BLOCK_N, 1] each, at each row's start), a chunk of BLOCK_K inputs being BLOCK_K / 32
    blocks of 16 bytes (BLOCK_K a multiple of 32)."""
    g = tl.arange(0, BLOCK_K // 32)[None, :, None]  # the chunk's blocks
    j = tl.arange(0, 16)[None, None, :]  # byte j of a block holds its inputs 2j and 2j + 1
    gate_values = gate_values[:, :, None] + g * 16 + j  # [BLOCK_N, BLOCK_K / 32, 16]
    gate_scales = gate_scales[:, :, None] + g  # [BLOCK_N, BLOCK_K / 32, 1]
    up_values = gate_values + I * (H // 2)
    up_scales = gate_scales + I * (H // 32)
    inputs = g * 32 + 2 * j  # [1, BLOCK_K / 32, 16]: the even inputs of each byte
    gate = tl.zeros((BLOCK_N, BLOCK_K // 32, 16), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K // 32, 16), dtype=tl.float32)
    squares = tl.zeros((1, BLOCK_K // 32, 16), dtype=tl.float32)
    for start in range(0, H, BLOCK_K):
        g_ok = g + start // 32 < H // 32
        x_even = tl.load(x_row + start + inputs, mask=g_ok, other=0.0).to(tl.float32)
        x_odd = tl.load(x_row + start + inputs + 1, mask=g_ok, other=0.0).to(tl.float32)
        if NORM:
            squares += x_even * x_even + x_odd * x_odd
            x_even *= tl.load(norm_weight_ptr + start + inputs, mask=g_ok, other=0.0).to(tl.float32)
            x_odd *= tl.load(norm_weight_ptr + start + inputs + 1, mask=g_ok, other=0.0).to(tl.float32)
        w_mask = n_ok[:, None, None] & g_ok
        gate += _mxfp4_row_products(gate_values + start // 2, gate_scales + start // 32, x_even, x_odd, w_mask)
        up += _mxfp4_row_products(up_values + start // 2, up_scales + start // 32, x_even, x_odd, w_mask)
    return tl.sum(tl.sum(gate, axis=2), axis=1), tl.sum(tl.sum(up, axis=2), axis=1), tl.sum(squares)


@triton.jit
def _slot_gate_up_kernel(
    x_ptr,
    w13_ptr,
    s13_ptr,
    b13_ptr,
    h_ptr,
    ids_ptr,
    norm_weight_ptr,
    eps,
    I,
    H,
    stride_xt,
    stride_we,
    stride_se,
    stride_be,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)  # the routing, just before, chose the expert
    slot = tl.program_id(0)
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    x_row = x_ptr + (slot // TOP_K).to(tl.int64) * stride_xt
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    rows = n[:, None].to(tl.int64)  # [BLOCK_N, 1]
    if MXFP4:
        gate_values = w13_ptr + expert * stride_we + rows * (H // 2)
        gate_scales = s13_ptr + expert * stride_se + rows * (H // 32)
        gate_sum, up_sum, squares = _mxfp4_gate_up_sums(
            x_row, gate_values, gate_scales, norm_weight_ptr, n_ok, I, H, NORM, BLOCK_N, BLOCK_K
        )
    else:
        gate_rows = w13_ptr + expert * stride_we + rows * H
        gate_sum, up_sum, squares = _dense_gate_up_sums(
            x_row, gate_rows, norm_weight_ptr, n_ok, I, H, NORM, BLOCK_N, BLOCK_K
        )
    if NORM:
        rstd = tl.rsqrt(squares / H + eps)
        gate_sum *= rstd
        up_sum *= rstd
    if HAS_BIAS:
        biases = b13_ptr + expert * stride_be + n
        gate_sum += tl.load(biases, mask=n_ok, other=0.0).to(tl.float32)
        up_sum += tl.load(biases + I, mask=n_ok, other=0.0).to(tl.float32)
    dtype = h_ptr.dtype.element_ty
    # gate and up rounded as the projection's output is, then the activation rounded once
    h = gated(gate_sum.to(dtype), up_sum.to(dtype), ACT).to(dtype)
    tl.store(h_ptr + slot * I + n, h, mask=n_ok)


@triton.jit
def _dense_down_sums(
    down_rows,
    h_rows,
    rows_ok,
    choice_ok,
    I,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """down . h ([BLOCK_J, BLOCK_N], fp32) of each choice's rows from `down_rows` [BLOCK_J, BLOCK_N, 1] and
    its slot's h from `h_rows` [BLOCK_J, 1, 1]; the first chunk of weights is read before the wait for the
    kernel before."""
    k = tl.arange(0, BLOCK_K)[None, None, :]
    down_rows = down_rows + k  # [BLOCK_J, BLOCK_N, BLOCK_K]
    h_rows = h_rows + k  # [BLOCK_J, 1, BLOCK_K]
    w = tl.load(down_rows, mask=rows_ok & (k < I), other=0.0)
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((BLOCK_J, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, I, BLOCK_K):
        k_ok = k + start < I
        # the next chunk's weights are in flight while this one is multiplied
        w_next = tl.load(down_rows + start + BLOCK_K, mask=rows_ok & (k + start + BLOCK_K < I), other=0.0)
        h = tl.load(h_rows + start, mask=choice_ok[:, None, None] & k_ok, other=0.0)
        acc += w.to(tl.float32) * h.to(tl.float32)
        w = w_next
    return tl.sum(acc, axis=2)


@triton.jit
def _mxfp4_down_sums(
    down_values,
    down_scales,
    h_rows,
    rows_ok,
    choice_ok,
    I,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """`_dense_down_sums` of MXFP4 rows: their bytes from `down_values` and their blocks' scales from
    `down_scales` ([BLOCK_J, BLOCK_N, 1] each), a chunk of BLOCK_K inputs being BLOCK_K / 32 blocks of 16
    bytes (BLOCK_K a multiple of 32). The choices' rows are taken as one list of BLOCK_J * BLOCK_N."""
    R: tl.constexpr = BLOCK_J * BLOCK_N
    g = tl.arange(0, BLOCK_K // 32)[None, :, None]  # the chunk's blocks
    j = tl.arange(0, 16)[None, None, :]  # byte j of a block holds its inputs 2j and 2j + 1
    down_values = tl.reshape(down_values, (R, 1, 1)) + g * 16 + j  # [R, BLOCK_K / 32, 16]
    down_scales = tl.reshape(down_scales, (R, 1, 1)) + g  # [R, BLOCK_K / 32, 1]
    h_rows = tl.reshape(tl.broadcast_to(h_rows, (BLOCK_J, BLOCK_N, 1)), (R, 1, 1)) + g * 32 + 2 * j
    rows_ok = tl.reshape(rows_ok, (R, 1, 1))
    h_ok = tl.reshape(tl.broadcast_to(choice_ok[:, None, None], (BLOCK_J, BLOCK_N, 1)), (R, 1, 1))
    w_mask = rows_ok & (g < I // 32)
    packed = tl.load(down_values, mask=w_mask, other=0)
    scales = tl.load(down_scales, mask=w_mask, other=0)
    wait_for_previous_kernel(PDL)
    acc = tl.zeros((R, BLOCK_K // 32, 16), dtype=tl.float32)
    for start in range(0, I, BLOCK_K):
        g_ok = g + start // 32 < I // 32
        next_mask = rows_ok & (g + (start + BLOCK_K) // 32 < I // 32)
        # the next chunk's bytes and scales are in flight while this one is multiplied
        packed_next = tl.load(down_values + (start + BLOCK_K) // 2, mask=next_mask, other=0)
        scales_next = tl.load(down_scales + (start + BLOCK_K) // 32, mask=next_mask, other=0)
        h_even = tl.load(h_rows + start, mask=h_ok & g_ok, other=0.0).to(tl.float32)
        h_odd = tl.load(h_rows + start + 1, mask=h_ok & g_ok, other=0.0).to(tl.float32)
        even, odd = dequantize_pairs(packed, scales)
        acc += even * h_even + odd * h_odd
        packed, scales = packed_next, scales_next
    return tl.reshape(tl.sum(tl.sum(acc, axis=2), axis=1), (BLOCK_J, BLOCK_N))


@triton.jit
def _token_down_kernel(
    h_ptr,
    w2_ptr,
    s2_ptr,
    b2_ptr,
    out_ptr,
    weights_ptr,
    ids_ptr,
    I,
    H,
    stride_we,
    stride_se,
    stride_ot,
    stride_be,
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MXFP4: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    token = tl.program_id(0)
    choices = tl.arange(0, BLOCK_J)
    choice_ok = choices < TOP_K
    slots = token * TOP_K + choices  # [BLOCK_J]
    # the routing finished two kernels ago: its ids and the experts' weights are read before the wait
    experts = tl.load(ids_ptr + slots, mask=choice_ok, other=0).to(tl.int64)  # [BLOCK_J]
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = n[None, :, None].to(tl.int64)  # [1, BLOCK_N, 1]: BLOCK_N rows of each choice's down
    rows_ok = choice_ok[:, None, None] & (n < H)[None, :, None]  # [BLOCK_J, BLOCK_N, 1]
    h_rows = h_ptr + slots[:, None, None].to(tl.int64) * I  # [BLOCK_J, 1, 1]
    if MXFP4:
        down_values = w2_ptr + experts[:, None, None] * stride_we + rows * (I // 2)
        down_scales = s2_ptr + experts[:, None, None] * stride_se + rows * (I // 32)
        y = _mxfp4_down_sums(down_values, down_scales, h_rows, rows_ok, choice_ok, I, BLOCK_J, BLOCK_N, BLOCK_K, PDL)
    else:
        down_rows = w2_ptr + experts[:, None, None] * stride_we + rows * I
        y = _dense_down_sums(down_rows, h_rows, rows_ok, choice_ok, I, BLOCK_J, BLOCK_N, BLOCK_K, PDL)
    # each choice's output rounded as the projection's is, weighted and rounded again, then summed in fp32
    dtype = h_ptr.dtype.element_ty
    if HAS_BIAS:
        y += tl.load(
            b2_ptr + experts[:, None] * stride_be + n[None, :], mask=choice_ok[:, None] & (n < H)[None, :], other=0.0
        ).to(tl.float32)
    y = y.to(dtype).to(tl.float32)
    weights = tl.load(weights_ptr + slots, mask=choice_ok, other=0.0)
    out = tl.sum((y * weights[:, None]).to(dtype).to(tl.float32), axis=0)
    tl.store(out_ptr + token * stride_ot + n, out.to(out_ptr.dtype.element_ty), mask=n < H)


def few_token_experts(
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
    """What `triton_moe.fused_experts` computes, for a few tokens: each choice reads its expert directly.
    With `norm_weight`, the experts run on RMSNorm(x) (weight `norm_weight`, epsilon `eps`), computed
    inside the gate/up kernel; `w13_bias` [experts, 2I] and `w2_bias` [experts, hidden] are added to the
    projections' sums where given. With `w13_scale` and `w2_scale` the weights are MXFP4, dequantized as
    they are read.

    x: [tokens, hidden]; w13: [experts, 2I, hidden]; w2: [experts, hidden, I];
    weights (fp32), ids: [tokens, top_k]; norm_weight: [hidden] -> [tokens, hidden] in x's dtype.
    MXFP4: w13 [experts, 2I, hidden / 2], w2 [experts, hidden, I / 2] uint8; w13_scale [experts, 2I,
    hidden / 32], w2_scale [experts, hidden, I / 32] uint8
    """
    num_tokens, hidden = x.shape
    mxfp4 = w13_scale is not None
    width, top_k = w2.size(2) * (2 if mxfp4 else 1), ids.size(1)
    num_slots = num_tokens * top_k
    ids, weights = ids.contiguous(), weights.contiguous()
    pdl = pdl_launch(x.device)
    h = torch.empty(num_slots, width, dtype=x.dtype, device=x.device)  # [slots, I]
    has_bias = w13_bias is not None
    if not has_bias:  # never read: the bias is compiled out
        w13_bias = w2_bias = weights
    if not mxfp4:  # never read: the scales are compiled out
        w13_scale, w2_scale = w13, w2
    block_n, block_k, num_warps = _MXFP4_GATE_UP_BLOCKS if mxfp4 else _GATE_UP_BLOCKS
    _slot_gate_up_kernel[(num_slots, triton.cdiv(width, block_n))](
        x,
        w13,
        w13_scale,
        w13_bias,
        h,
        ids,
        norm_weight if norm_weight is not None else x,
        eps,
        width,
        hidden,
        x.stride(0),
        w13.stride(0),
        w13_scale.stride(0),
        w13_bias.stride(0),
        TOP_K=top_k,
        ACT=ACTIVATIONS[hidden_act],
        NORM=norm_weight is not None,
        HAS_BIAS=has_bias,
        MXFP4=mxfp4,
        BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(hidden)),
        num_warps=num_warps,
        **pdl,
    )
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    block_n, block_k, num_warps = _MXFP4_DOWN_BLOCKS if mxfp4 else _DOWN_BLOCKS
    _token_down_kernel[(num_tokens, triton.cdiv(hidden, block_n))](
        h,
        w2,
        w2_scale,
        w2_bias,
        out,
        weights,
        ids,
        width,
        hidden,
        w2.stride(0),
        w2_scale.stride(0),
        out.stride(0),
        w2_bias.stride(0),
        TOP_K=top_k,
        HAS_BIAS=has_bias,
        MXFP4=mxfp4,
        BLOCK_J=triton.next_power_of_2(top_k),
        BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(width)),
        num_warps=num_warps,
        **pdl,
    )
    return out
