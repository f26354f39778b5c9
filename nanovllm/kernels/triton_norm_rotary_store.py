"""Triton kernel: per-head RMSNorm (Qwen3's q/k norm, optional), rotary embedding of q and k, and the
store of this step's K/V into the paged cache, one launch.

Layout: q [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim]
(rows and heads may be strided, each head's values contiguous, as views of the
QKV projection's output are); positions [tokens] (int); cos_sin
[max_position, 2, head_dim] fp32, the rotate-half table; q_weight, k_weight
[head_dim]; k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim]
contiguous, so flat slot s of head h starts at (s * kv_heads + h) * head_dim;
slot_mapping [tokens], -1 = store nothing (a padded CUDA-graph row, or a token
whose K/V is already cached). The rotated q and k are new contiguous tensors of
q's and k's shapes. Grid: (tokens, heads + 2 * kv_heads) with a cache, else
(tokens, heads + kv_heads): a program normalises and rotates one q or k head
of one token, the two halves of the head as two vectors, and writes a k head
to the cache too; a v program copies one v head to the cache.

An FP8 cache (QUANTIZED, with k_scale, v_scale: [num_blocks, kv_heads,
block_size] fp32) stores each k or v head as float8 values and its scale,
amax / 448, computed from the head's values in the model's dtype as
`kernels/fp8_kv.quantize_heads` computes them.

The arithmetic is the plain-PyTorch reference's
(`layers/rotary_embedding.norm_rotate_qk_reference`): the norm in fp32, its
result and the cos/sin table rounded to the model's dtype where the reference
rounds them, the rotation in fp32 (as the compiled reference does it). One
decode step of one sequence ran this as two generated kernels plus a store
kernel per layer; each launch in that chain costs its latency.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.fp8_kv import FP8_MAX
from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel


_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def _store_head(x1, x2, cache_ptr, scale_ptr, slot, kv_head, lanes, mask, NUM_KV_HEADS: tl.constexpr,
                HALF: tl.constexpr, PAGE: tl.constexpr, QUANTIZED: tl.constexpr):
    """Write one head, halves x1 and x2 [BLOCK] in the model's dtype, to flat slot `slot` (quantized for
    an FP8 cache)."""
    target = cache_ptr + (slot * NUM_KV_HEADS + kv_head) * (2 * HALF)
    if QUANTIZED:
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        amax = tl.maximum(tl.max(tl.where(mask, tl.abs(x1), 0.0), 0), tl.max(tl.where(mask, tl.abs(x2), 0.0), 0))
        scale = tl.where(amax > 0, amax / _FP8_MAX, 1.0)
        tl.store(scale_ptr + ((slot // PAGE) * NUM_KV_HEADS + kv_head) * PAGE + slot % PAGE, scale)
        x1 = x1 / scale
        x2 = x2 / scale
    tl.store(target + lanes, x1.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(target + HALF + lanes, x2.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_rotate_store_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_out_ptr, positions_ptr, cos_sin_ptr, q_weight_ptr,
                              k_weight_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_mapping_ptr,
                              eps, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                              NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                              BLOCK: tl.constexpr, PAGE: tl.constexpr, NORM: tl.constexpr, STORE: tl.constexpr,
                              QUANTIZED: tl.constexpr, PDL: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    is_q = head < NUM_HEADS
    lanes = tl.arange(0, BLOCK)
    mask = lanes < HALF
    dtype = q_out_ptr.dtype.element_ty
    # No kernel writes the slots, positions, table or weights: they are read before waiting for
    # the previous kernel (under PDL, while it runs).
    slot = -1
    if STORE:
        slot = tl.load(slot_mapping_ptr + token)
    table = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * (4 * HALF)
    # rotate-half: the table repeats its frequencies over both halves
    cos = tl.load(table + lanes, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(table + 2 * HALF + lanes, mask=mask, other=0.0).to(dtype).to(tl.float32)
    if NORM:
        w1 = tl.where(is_q, tl.load(q_weight_ptr + lanes, mask=mask, other=0.0),
                      tl.load(k_weight_ptr + lanes, mask=mask, other=0.0)).to(tl.float32)
        w2 = tl.where(is_q, tl.load(q_weight_ptr + HALF + lanes, mask=mask, other=0.0),
                      tl.load(k_weight_ptr + HALF + lanes, mask=mask, other=0.0)).to(tl.float32)
    wait_for_previous_kernel(PDL)
    if head >= NUM_HEADS + NUM_KV_HEADS:  # a v head: into the cache unchanged
        kv_head = head - NUM_HEADS - NUM_KV_HEADS
        if slot >= 0:
            source = v_ptr + token * stride_vt + kv_head * stride_vh
            v1 = tl.load(source + lanes, mask=mask)
            v2 = tl.load(source + HALF + lanes, mask=mask)
            _store_head(v1, v2, v_cache_ptr, v_scale_ptr, slot, kv_head, lanes, mask, NUM_KV_HEADS, HALF, PAGE,
                        QUANTIZED)
    else:
        if is_q:
            source = q_ptr + token * stride_qt + head * stride_qh
            target = q_out_ptr + (token * NUM_HEADS + head) * (2 * HALF)
        else:
            source = k_ptr + token * stride_kt + (head - NUM_HEADS) * stride_kh
            target = k_out_ptr + (token * NUM_KV_HEADS + head - NUM_HEADS) * (2 * HALF)
        # x1, x2: the head's two halves [BLOCK], fp32
        x1 = tl.load(source + lanes, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(source + HALF + lanes, mask=mask, other=0.0).to(tl.float32)
        if NORM:
            rstd = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
            x1 = w1 * (x1 * rstd).to(dtype).to(tl.float32)
            x2 = w2 * (x2 * rstd).to(dtype).to(tl.float32)
            x1 = x1.to(dtype).to(tl.float32)
            x2 = x2.to(dtype).to(tl.float32)
        y1 = (x1 * cos - x2 * sin).to(dtype)
        y2 = (x2 * cos + x1 * sin).to(dtype)
        tl.store(target + lanes, y1, mask=mask)
        tl.store(target + HALF + lanes, y2, mask=mask)
        if head >= NUM_HEADS:
            if slot >= 0:  # a k head: its rotated values into the cache too
                _store_head(y1, y2, k_cache_ptr, k_scale_ptr, slot, head - NUM_HEADS, lanes, mask, NUM_KV_HEADS,
                            HALF, PAGE, QUANTIZED)


def norm_rotate_store(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor,
                      q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                      v: torch.Tensor | None = None, k_cache: torch.Tensor | None = None,
                      v_cache: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None,
                      k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated at `positions`, each head RMS-normalised first when weights are given; given v and
    the caches, the rotated k and v are also written at `slot_mapping` (-1 skipped), quantized where
    the scales of an FP8 cache are given."""
    # positions, slot_mapping: [tokens]; q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.size(1)
    store = k_cache is not None
    v = v if store else k
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and head_dim % 2 == 0
    assert cos_sin.is_contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    norm = q_weight is not None
    if store:
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[-2:] == (num_kv_heads, head_dim)
    quantized = k_scale is not None
    grid = (num_tokens, num_heads + num_kv_heads * (2 if store else 1))
    _norm_rotate_store_kernel[grid](
        q, k, v, q_out, k_out, positions, cos_sin, q_weight if norm else q, k_weight if norm else k,
        k_cache if store else k, v_cache if store else v, k_scale if quantized else q, v_scale if quantized else q,
        slot_mapping if store else positions, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2, BLOCK=triton.next_power_of_2(head_dim // 2),
        PAGE=k_cache.size(1) if store else 1, NORM=norm, STORE=store, QUANTIZED=quantized, num_warps=1,
        **pdl_launch(q.device))
    return q_out, k_out
