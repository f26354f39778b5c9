"""Triton building blocks both attention kernels use: a K/V tile read through a
block table, and one online-softmax update over it.

The cache layout is k_cache, v_cache: [num_blocks, PAGE, kv_heads, head_dim];
a tile is BLOCK_N consecutive positions of one sequence and one KV head.
"""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # scores are kept in base 2: exp(x) = exp2(x * LOG2E)


@triton.jit
def paged_kv_tile(k_cache_ptr, v_cache_ptr, block_table_ptr, pos, pos_mask, head_offset, d, d_mask,
                  stride_cb, stride_ct, PAGE: tl.constexpr):
    """K and V [BLOCK_N, BLOCK_D] at positions `pos` of the sequence whose table row is `block_table_ptr`."""
    block = tl.load(block_table_ptr + pos // PAGE, mask=pos_mask, other=0)
    rows = block.to(tl.int64) * stride_cb + (pos % PAGE) * stride_ct + head_offset
    kv_mask = pos_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    return k, v


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
