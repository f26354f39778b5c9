"""Triton kernel: per-head RMSNorm (Qwen3's q/k norm, optional) and rotary embedding of q and k, one launch.

Layout: q [tokens, heads, head_dim], k [tokens, kv_heads, head_dim] (rows and
heads may be strided, each head's values contiguous, as views of the QKV
projection's output are); positions [tokens] (int); cos_sin [max_position, 2,
head_dim] fp32, the rotate-half table; q_weight, k_weight [head_dim]. Outputs
are new contiguous tensors of q's and k's shapes. Grid: (tokens, heads +
kv_heads): a program normalises and rotates one head of one token, the two
halves of the head as two vectors.

The arithmetic is the plain-PyTorch reference's
(`layers/rotary_embedding.norm_rotate_qk_reference`): the norm in fp32, its
result and the cos/sin table rounded to the model's dtype where the reference
rounds them, the rotation in fp32 (as the compiled reference does it). Qwen3
decoding ran this as two generated kernels, 4.2 µs a layer at one sequence.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel


@triton.jit
def _norm_rotate_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, positions_ptr, cos_sin_ptr, q_weight_ptr, k_weight_ptr,
                        eps, stride_qt, stride_qh, stride_kt, stride_kh, NUM_HEADS: tl.constexpr,
                        NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr,
                        PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    if head < NUM_HEADS:
        source = q_ptr + token.to(tl.int64) * stride_qt + head * stride_qh
        target = q_out_ptr + (token.to(tl.int64) * NUM_HEADS + head) * (2 * HALF)
        weight_ptr = q_weight_ptr
    else:
        source = k_ptr + token.to(tl.int64) * stride_kt + (head - NUM_HEADS) * stride_kh
        target = k_out_ptr + (token.to(tl.int64) * NUM_KV_HEADS + head - NUM_HEADS) * (2 * HALF)
        weight_ptr = k_weight_ptr
    dtype = q_out_ptr.dtype.element_ty
    lanes = tl.arange(0, BLOCK)
    mask = lanes < HALF
    # x1, x2: the head's two halves [BLOCK], fp32
    x1 = tl.load(source + lanes, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(source + HALF + lanes, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
        w1 = tl.load(weight_ptr + lanes, mask=mask, other=0.0).to(tl.float32)
        w2 = tl.load(weight_ptr + HALF + lanes, mask=mask, other=0.0).to(tl.float32)
        x1 = w1 * (x1 * rstd).to(dtype).to(tl.float32)
        x2 = w2 * (x2 * rstd).to(dtype).to(tl.float32)
        x1 = x1.to(dtype).to(tl.float32)
        x2 = x2.to(dtype).to(tl.float32)
    table = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * (4 * HALF)
    # rotate-half: the table repeats its frequencies over both halves
    cos = tl.load(table + lanes, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(table + 2 * HALF + lanes, mask=mask, other=0.0).to(dtype).to(tl.float32)
    tl.store(target + lanes, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(target + HALF + lanes, (x2 * cos + x1 * sin).to(dtype), mask=mask)


def norm_rotate_qk(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
                   q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated at `positions`, each head RMS-normalised first when weights are given."""
    # positions: [tokens]; q: [tokens, heads, head_dim]; k: [tokens, kv_heads, head_dim]
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.size(1)
    assert q.stride(2) == 1 and k.stride(2) == 1 and head_dim % 2 == 0 and cos_sin.is_contiguous()
    q_out, k_out = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype,
                                                                                     device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    norm = q_weight is not None
    _norm_rotate_kernel[(num_tokens, num_heads + num_kv_heads)](
        q, k, q_out, k_out, positions, cos_sin, q_weight if norm else q, k_weight if norm else k, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads,
        HALF=head_dim // 2, BLOCK=triton.next_power_of_2(head_dim // 2), NORM=norm, num_warps=1,
        **pdl_launch(q.device))
    return q_out, k_out
