"""Triton building blocks both attention kernels use: a K/V tile read through a
block table, and one online-softmax update over it.

The cache layout is k_cache, v_cache: [num_blocks, PAGE, kv_heads, head_dim];
a tile is BLOCK_N consecutive positions of one sequence and one KV head. An
FP8 cache (QUANTIZED) has scales k_scale, v_scale: [num_blocks, kv_heads,
PAGE] fp32 beside it; the tile read multiplies each row by its scale, so no
full-precision copy of the cache exists outside registers.
"""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # scores are kept in base 2: exp(x) = exp2(x * LOG2E)


@triton.jit
def paged_kv_tile(k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_table_ptr, pos, pos_mask, kv_head,
                  d, d_mask, stride_cb, stride_ct, stride_ch, stride_sb, dtype: tl.constexpr, PAGE: tl.constexpr,
                  QUANTIZED: tl.constexpr):
    """K and V [BLOCK_N, BLOCK_D] in `dtype` at positions `pos` of the sequence whose table row is
    `block_table_ptr`; an FP8 cache's values times their scales."""
    block = tl.load(block_table_ptr + pos // PAGE, mask=pos_mask, other=0).to(tl.int64)
    rows = block * stride_cb + (pos % PAGE) * stride_ct + kv_head * stride_ch
    kv_mask = pos_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if QUANTIZED:
        scale_rows = block * stride_sb + kv_head * PAGE + pos % PAGE
        k_scale = tl.load(k_scale_ptr + scale_rows, mask=pos_mask, other=0.0)
        v_scale = tl.load(v_scale_ptr + scale_rows, mask=pos_mask, other=0.0)
        k = k.to(tl.float32) * k_scale[:, None]
        v = v.to(tl.float32) * v_scale[:, None]
    return k.to(dtype), v.to(dtype)


@triton.jit
def online_softmax_step(q, k, v, mask, m, l, acc, scale_log2, PRECISION: tl.constexpr):
    """Fold keys k and values v [N, D] into the running max m, sum l and output acc of rows q [M, D].

    Scores are in base 2 (`scale_log2` includes log2(e)); `mask` [M, N] or [1, N] marks the keys each row sees.
    """
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l, acc
