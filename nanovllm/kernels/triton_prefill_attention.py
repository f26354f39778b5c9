"""Triton kernel: variable-length causal prefill attention, reading a cached prefix through block tables.

The new tokens of all sequences are packed: q: [tokens, heads, head_dim],
k, v: [tokens, kv_heads, head_dim]; sequence i's new tokens are rows
cu_seqlens_q[i] .. cu_seqlens_q[i + 1] and its key length (cached prefix plus
new tokens) is cu_seqlens_k[i + 1] - cu_seqlens_k[i]. The prefix (the first
key_len - query_len positions) is read from k_cache, v_cache: [num_blocks,
block_size, kv_heads, head_dim] through block_tables: [seqs, max_blocks]; the
new tokens' keys come straight from k and v, so the kernel also runs before
the cache exists (warm-up). An FP8 cache (with k_scale, v_scale: [num_blocks,
kv_heads, block_size]) is read for the new tokens' keys too: they are already
stored, and reading them back quantized makes a prompt attend the same keys
whether its prefix was cached or computed in this step.

Grid: (cdiv(max_seqlen_q, BLOCK_M), seqs, heads). A program owns BLOCK_M query
rows of one head of one sequence: it first sweeps the prefix tiles (no mask),
then the new-token tiles up to its last row (causal mask), with an online
softmax in fp32. BLOCK_M, BLOCK_N and the launch settings come by head_dim and
dtype from `prefill_tiles` (triton_attention_tile_shapes.py), which keeps
head_dim 512's tiles within an SM's shared memory and registers.

With a sliding window (SLIDING, `window` W: a query at position p sees keys
p - W + 1 .. p) both sweeps start at the window of the program's first row and
each row masks the keys behind its own window, so nothing before the first
row's window is read. A soft-cap (SOFTCAP) is applied to each score in the
softmax step. With SINKS each head's sink logit joins its rows' softmax sum at
the end (`sink_share`). With these off the kernel compiles as without them.

A chunked-prefill step runs its decodes here too, as queries of length 1 over
their cached prefix: their programs past the first row tile return at once,
and the first computes a BLOCK_M-row tile for its one real row. That wasted
arithmetic rides on a read of the prefix that bounds the time anyway;
decode-only steps still go through the dedicated decode kernel.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_attention_tile_shapes import padded_head_dim, prefill_tiles
from nanovllm.kernels.triton_attention_tiles import (
    LOG2E,
    online_softmax_step,
    paged_kv_tile,
    paged_view,
    sink_logit,
    sink_share,
    tile_dtype,
)


# The block-table width follows the batch's longest sequence; specialising on it
# would recompile the kernel for widths of 1 or multiples of 16 in the middle of a run
# (and on the window, for windows that are or are not multiples of 16).
@triton.jit(do_not_specialize=["stride_bt", "window"])
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_tables_ptr,
    cu_q_ptr,
    cu_k_ptr,
    sinks_ptr,
    o_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_sb,
    stride_bt,
    stride_ot,
    stride_oh,
    scale_log2,
    window,
    softcap_log2,
    PAGE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_PREFIX: tl.constexpr,
    QUANTIZED: tl.constexpr,
    TILE_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
):
    m_block = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    if SINKS:
        sink = sink_logit(sinks_ptr, head)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    kv_head = head // GROUP
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index among the new tokens
    row_mask = rows < q_len
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + (q_start + rows)[:, None].to(tl.int64) * stride_qt + head * stride_qh + d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(TILE_DTYPE)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    prefix_len = 0
    table = block_tables_ptr + seq * stride_bt
    if HAS_PREFIX:
        prefix_len = tl.load(cu_k_ptr + seq + 1) - tl.load(cu_k_ptr + seq) - q_len
        prefix_start = 0
        if SLIDING:  # from the window of the program's first row, at position prefix_len + m_block * BLOCK_M
            prefix_start = tl.maximum(prefix_len + m_block * BLOCK_M - window + 1, 0)
        for tile in range(prefix_start, prefix_len, BLOCK_N):
            pos = tile + tl.arange(0, BLOCK_N)
            pos_mask = pos < prefix_len
            seen = pos_mask[None, :]
            if SLIDING:  # each row's window starts at its own position - window + 1
                seen = seen & (pos[None, :] > prefix_len + rows[:, None] - window)
            k, v, k_scale, v_scale = paged_kv_tile(
                k_cache_ptr,
                v_cache_ptr,
                k_scale_ptr,
                v_scale_ptr,
                table,
                pos,
                pos_mask,
                kv_head,
                d,
                d_mask,
                stride_cb,
                stride_ct,
                stride_ch,
                stride_sb,
                q.dtype,
                PAGE,
                QUANTIZED,
            )
            m, l, acc = online_softmax_step(
                q,
                k,
                v,
                seen,
                m,
                l,
                acc,
                scale_log2,
                k_scale,
                v_scale,
                softcap_log2,
                PRECISION,
                QUANTIZED,
                SOFTCAP,
                SLIDING,
            )

    last = tl.minimum(q_len, (m_block + 1) * BLOCK_M)
    first = 0
    if SLIDING:
        first = tl.maximum(m_block * BLOCK_M - window + 1, 0)
    for tile in range(first, last, BLOCK_N):
        cols = tile + tl.arange(0, BLOCK_N)
        col_mask = cols < q_len
        k_scale = 1.0
        v_scale = 1.0
        if QUANTIZED:  # the new tokens as the cache holds them
            k, v, k_scale, v_scale = paged_kv_tile(
                k_cache_ptr,
                v_cache_ptr,
                k_scale_ptr,
                v_scale_ptr,
                table,
                prefix_len + cols,
                col_mask,
                kv_head,
                d,
                d_mask,
                stride_cb,
                stride_ct,
                stride_ch,
                stride_sb,
                q.dtype,
                PAGE,
                QUANTIZED,
            )
        else:
            kv_rows = (q_start + cols).to(tl.int64)
            kv_mask = col_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_ptr + kv_rows[:, None] * stride_kt + kv_head * stride_kh + d[None, :], mask=kv_mask, other=0.0
            )
            v = tl.load(
                v_ptr + kv_rows[:, None] * stride_vt + kv_head * stride_vh + d[None, :], mask=kv_mask, other=0.0
            )
        causal = (cols[None, :] <= rows[:, None]) & col_mask[None, :]
        if SLIDING:
            causal = causal & (cols[None, :] > rows[:, None] - window)
        m, l, acc = online_softmax_step(
            q,
            k,
            v,
            causal,
            m,
            l,
            acc,
            scale_log2,
            k_scale,
            v_scale,
            softcap_log2,
            PRECISION,
            QUANTIZED,
            SOFTCAP,
            SLIDING,
        )

    out = acc / l[:, None]
    if SINKS:
        out *= sink_share(sink, m + tl.log2(l))[:, None]
    tl.store(
        o_ptr + (q_start + rows)[:, None].to(tl.int64) * stride_ot + head * stride_oh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached prefix and themselves.

    `block_tables` None means no sequence has a cached prefix; an FP8 cache (with
    `k_scale`, `v_scale`) needs them always, as every key is read from it. `window`: each query sees
    only its last `window` positions; `softcap`: each score s becomes softcap * tanh(s / softcap);
    `sinks` ([heads]): each head's sink logit joins its softmax sum.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.size(1)
    num_seqs = cu_seqlens_q.numel() - 1
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
    o = torch.empty_like(q)
    has_prefix = block_tables is not None
    quantized = k_scale is not None
    assert has_prefix or not quantized
    assert not has_prefix or paged_view(k_cache, v_cache)
    if not has_prefix:  # never read: the prefix sweep is compiled out
        k_cache = v_cache = block_tables = k
    if not quantized:  # never read: the scaling is compiled out
        k_scale = v_scale = cu_seqlens_k
    fp32 = q.dtype == torch.float32
    tiles = prefill_tiles(head_dim, q.dtype)
    grid = (triton.cdiv(max_seqlen_q, tiles.block_m), num_seqs, num_heads)
    _prefill_kernel[grid](
        q,
        k,
        v,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        block_tables,
        cu_seqlens_q,
        cu_seqlens_k,
        cu_seqlens_k if sinks is None else sinks,  # never read without sinks
        o,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_scale.stride(0),
        block_tables.stride(0),
        o.stride(0),
        o.stride(1),
        scale * LOG2E,
        window or 0,
        (softcap or 0.0) * LOG2E,
        PAGE=k_cache.size(1) if has_prefix else 16,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=padded_head_dim(head_dim),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        HAS_PREFIX=has_prefix,
        QUANTIZED=quantized,
        TILE_DTYPE=tile_dtype(q.dtype, quantized),
        PRECISION="ieee" if fp32 else "tf32",
        SLIDING=window is not None,
        SOFTCAP=softcap is not None,
        SINKS=sinks is not None,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return o
