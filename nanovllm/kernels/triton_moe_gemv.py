"""Triton kernels: the experts of a few tokens (a small decode step), one token's choice per program row.

A decode step of a few sequences gives each expert at most a token or two, so
the grouped GEMMs of `triton_moe.py` would multiply blocks of 16 rows that
are almost all padding, after a chain of small launches that align the
tokens by expert. Here nothing is aligned: slot p = t * top_k + j (token t's
j-th choice) reads its expert ids[p] straight from the routing, and each
program streams BLOCK_N rows of that expert's weights once, multiplying them
with the slot's input (which stays in cache) on the CUDA cores and summing in
fp32, as the one-row GEMV (`triton_gemv.py`) does.

1. `_slot_gate_up_kernel`, grid (slots, cdiv(I, BLOCK_N)): h [slots, I] =
   act(gate . x_t) * (up . x_t) for BLOCK_N features of the slot's expert.
2. `_slot_down_kernel`, grid (slots, cdiv(hidden, BLOCK_N)): out [slots,
   hidden] fp32 = weights[p] * (down . h_p); a token's top_k rows are then
   summed.

Roundings are those of the PyTorch path (`layers/fused_moe.moe_experts`), as
in `triton_moe.py`. The block sizes are first choices, not yet swept.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_gated_activation import ACTIVATIONS, gated

_GATE_UP_BLOCKS = (4, 512)  # (BLOCK_N, BLOCK_K): 2 x 4 rows of the expert's gate and up per program
_DOWN_BLOCKS = (8, 256)


@triton.jit
def _slot_gate_up_kernel(
    x_ptr,
    w13_ptr,
    h_ptr,
    ids_ptr,
    I,
    H,
    stride_xt,
    stride_we,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    slot = tl.program_id(0)
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    x_row = x_ptr + (slot // TOP_K).to(tl.int64) * stride_xt
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    k = tl.arange(0, BLOCK_K)
    gate_rows = w13_ptr + expert * stride_we + n[:, None].to(tl.int64) * H + k[None, :]  # [BLOCK_N, BLOCK_K]
    up_rows = gate_rows + I * H
    gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, H, BLOCK_K):
        k_ok = k + start < H
        x = tl.load(x_row + start + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        w_mask = n_ok[:, None] & k_ok[None, :]
        gate += tl.load(gate_rows + start, mask=w_mask, other=0.0).to(tl.float32) * x
        up += tl.load(up_rows + start, mask=w_mask, other=0.0).to(tl.float32) * x
    dtype = h_ptr.dtype.element_ty
    # gate and up rounded as the projection's output is, then the activation rounded once
    h = gated(tl.sum(gate, axis=1).to(dtype), tl.sum(up, axis=1).to(dtype), ACT).to(dtype)
    tl.store(h_ptr + slot * I + n, h, mask=n_ok)


@triton.jit
def _slot_down_kernel(
    h_ptr,
    w2_ptr,
    out_ptr,
    weights_ptr,
    ids_ptr,
    I,
    H,
    stride_we,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    slot = tl.program_id(0)
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    k = tl.arange(0, BLOCK_K)
    down_rows = w2_ptr + expert * stride_we + n[:, None].to(tl.int64) * I + k[None, :]  # [BLOCK_N, BLOCK_K]
    h_row = h_ptr + slot * I
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, I, BLOCK_K):
        k_ok = k + start < I
        h = tl.load(h_row + start + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        acc += tl.load(down_rows + start, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32) * h
    y = tl.sum(acc, axis=1).to(h_ptr.dtype.element_ty).to(tl.float32) * tl.load(weights_ptr + slot)
    tl.store(out_ptr + slot * H + n, y, mask=n_ok)


def few_token_experts(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, hidden_act: str
) -> torch.Tensor:
    """What `triton_moe.fused_experts` computes, for a few tokens: each choice reads its expert directly.

    x: [tokens, hidden]; w13: [experts, 2I, hidden]; w2: [experts, hidden, I];
    weights (fp32), ids: [tokens, top_k] -> [tokens, hidden] in x's dtype
    """
    num_tokens, hidden = x.shape
    width, top_k = w2.size(2), ids.size(1)
    num_slots = num_tokens * top_k
    ids, weights = ids.contiguous(), weights.contiguous()
    h = torch.empty(num_slots, width, dtype=x.dtype, device=x.device)  # [slots, I]
    block_n, block_k = _GATE_UP_BLOCKS
    _slot_gate_up_kernel[(num_slots, triton.cdiv(width, block_n))](
        x,
        w13,
        h,
        ids,
        width,
        hidden,
        x.stride(0),
        w13.stride(0),
        TOP_K=top_k,
        ACT=ACTIVATIONS[hidden_act],
        BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(hidden)),
    )
    out = torch.empty(num_slots, hidden, dtype=torch.float32, device=x.device)  # [slots, hidden]
    block_n, block_k = _DOWN_BLOCKS
    _slot_down_kernel[(num_slots, triton.cdiv(hidden, block_n))](
        h,
        w2,
        out,
        weights,
        ids,
        width,
        hidden,
        w2.stride(0),
        BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(width)),
    )
    return out.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
