"""Triton building blocks both attention kernels use: a K/V tile read through a
block table, and one online-softmax update over it.

The cache layout is k_cache, v_cache: [num_blocks, PAGE, kv_heads, head_dim],
each block contiguous, the blocks `stride(0)` apart, the same for K and V
(`paged_view`: one layer's slot in a cache whose blocks hold several); a tile
is BLOCK_N consecutive positions of one sequence and one KV head. An FP8 cache
(QUANTIZED) has scales k_scale, v_scale: [num_blocks, kv_heads, PAGE] fp32
beside it, each block's contiguous too; the tile read converts the values and
loads their scales, and the softmax step applies the scales, so no
full-precision copy of the cache exists outside registers. A soft-cap (SOFTCAP) turns each score s into
c * tanh(s / c) in the softmax step; off, it is compiled out.

An attention sink (gpt-oss: one learned logit per head) joins each row's softmax
denominator and takes no value: a row whose keys' scores have log-sum-exp L
(base 2) keeps the share 1 / (1 + 2^(sink - L)) of its output (`sink_share`),
applied once a row's sum is final.
"""

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # scores are kept in base 2: exp(x) = exp2(x * LOG2E)
_LOG2E = tl.constexpr(LOG2E)  # the same inside a kernel, which reads no plain global when compiled
_TILE_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def tile_dtype(q_dtype: torch.dtype, quantized: bool) -> tl.dtype:
    """The dtype q and the K/V tiles meet in tl.dot: the queries' own, but fp16 for an FP8 cache of a
    16-bit model. e4m3 values convert to fp16 exactly in one instruction per pair, while bf16 takes a
    sequence that makes the conversions, not the memory, bound the decode kernel; fp16 also holds every
    bf16 query of realistic size (|q| < 65504) with more mantissa."""
    return tl.float16 if quantized and q_dtype != torch.float32 else _TILE_DTYPES[q_dtype]


def paged_view(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether K and V caches [num_blocks, PAGE, kv_heads, head_dim] are laid out as the kernels read them:
    each block contiguous, K's and V's blocks equally far apart."""
    return k_cache.stride() == v_cache.stride() and k_cache[0].is_contiguous()


@triton.jit
def paged_kv_tile(
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_table_ptr,
    pos,
    pos_mask,
    kv_head,
    d,
    d_mask,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_sb,
    dtype: tl.constexpr,
    PAGE: tl.constexpr,
    QUANTIZED: tl.constexpr,
):
    """K and V [BLOCK_N, BLOCK_D] in `dtype` at positions `pos` of the sequence whose table row is
    `block_table_ptr`, and for an FP8 cache each position's K and V scales [BLOCK_N] (else 1)."""
    block = tl.load(block_table_ptr + pos // PAGE, mask=pos_mask, other=0).to(tl.int64)
    rows = block * stride_cb + (pos % PAGE) * stride_ct + kv_head * stride_ch
    kv_mask = pos_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0).to(dtype)
    v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0).to(dtype)
    k_scale = 1.0
    v_scale = 1.0
    if QUANTIZED:
        scale_rows = block * stride_sb + kv_head * PAGE + pos % PAGE
        k_scale = tl.load(k_scale_ptr + scale_rows, mask=pos_mask, other=0.0)
        v_scale = tl.load(v_scale_ptr + scale_rows, mask=pos_mask, other=0.0)
    return k, v, k_scale, v_scale


@triton.jit
def _tanh(x):
    # from exp2 (the interpreter has no libdevice); e^(-2|x|) <= 1 neither overflows nor loses x's sign
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # 2 * log2(e)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def online_softmax_step(
    q,
    k,
    v,
    mask,
    m,
    l,
    acc,
    scale_log2,
    k_scale,
    v_scale,
    softcap_log2,
    PRECISION: tl.constexpr,
    QUANTIZED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    EMPTY_ROWS: tl.constexpr,
):
    """Fold keys k and values v [N, D] into the running max m, sum l and output acc of rows q [M, D].

    Scores are in base 2 (`scale_log2` includes log2(e)); `mask` [M, N] or [1, N] marks the keys each row sees.
    An FP8 cache's scales [N] multiply the scores and the weights rather than the tiles: a few hundred
    products per tile instead of one per cached value. Every tile has a key to see, so its largest
    value scale is > 0. With SOFTCAP each score s becomes c * tanh(s / c); `softcap_log2` is c * log2(e),
    as the scores are in base 2. EMPTY_ROWS says a row may see none of the keys of a tile before it has
    seen any (a sliding window's first tiles): its weights are then kept at 0 rather than NaN.
    """
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    if QUANTIZED:
        s = s * k_scale[None, :]
    if SOFTCAP:
        s = softcap_log2 * _tanh(s / softcap_log2)
    s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_ref = m_new
    if EMPTY_ROWS:  # exp2(-inf - -inf) would be NaN: weigh a row that has seen no key against 0
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m - m_ref)
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if QUANTIZED:
        # the weights times each value's scale relative to the tile's largest, so that they stay in
        # [0, 1] where fp16 keeps their precision; the largest multiplies the tile's sum
        top = tl.max(v_scale, 0)
        acc += tl.dot((p * (v_scale / top)[None, :]).to(v.dtype), v, input_precision=PRECISION) * top
    else:
        acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def sink_logit(sinks_ptr, heads):
    """The sink logit of each of `heads`, in base 2. Sinks are weights: a kernel reads them before it waits
    for the kernel before it, so their load costs no time at the end."""
    return tl.load(sinks_ptr + heads).to(tl.float32) * _LOG2E


@triton.jit
def sink_share(sink, lse):
    """The share of each row's output its keys keep beside its head's sink (`sink_logit`): 1 / (1 + 2^(sink -
    lse)), lse (base 2) the log-sum-exp of the row's scores; 0 for a row that saw no key (lse -inf)."""
    return 1.0 / (1.0 + tl.exp2(sink - lse))
