"""Triton kernels: decode attention over the paged KV cache (flash-decoding).

QUERIES query tokens per sequence: one in a plain decode step, the last token
and its drafts (padded to a fixed count) in a speculative verify step. Layouts:
q: [seqs * QUERIES, heads, head_dim], a sequence's queries one after another;
k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim] (for an FP8
cache, with k_scale, v_scale: [num_blocks, kv_heads, block_size] fp32);
block_tables: [seqs, max_blocks] (int32); context_lens: [seqs * QUERIES], the
keys each query sees (0 = padded slot; a query sees positions 0 .. len - 1, so
the causal mask among a sequence's queries is their lengths, and the last
query of a sequence sees the most); seq_order: [seqs], optional, the sequences
longest context first.

Pass 1, grid (kv_heads, seqs, num_splits): a program takes one KV head, one
sequence and one slice of the context. Programs start in launch order; with
one split, launch row i takes sequence seq_order[i]: longest context first, so
that short ones fill the SMs at the end rather than one long context running
on alone. The KV heads of a sequence are neighbours in the launch order, so they
read the interleaved head rows of the same pages at about the same time. All
query heads of that KV head (the GQA group) of all the sequence's queries, padded
to 16 rows for tl.dot, share each K/V tile it loads: a verify step reads the
context once, not once per query. It keeps an online softmax and writes its
slice's normalised output and log-sum-exp (base 2).
Pass 2, grid (seqs * QUERIES, heads): merges the slices, weighting each by exp2(lse - max).
With one split pass 1 writes the final output and pass 2 is skipped. Pass 1's
tile (BLOCK_N) and launch settings come by head_dim, dtype and rows from
`decode_tiles` (triton_attention_tile_shapes.py), which keeps head_dim 512's
within an SM's shared memory and registers; the merge is the same at any.

With a sliding window (SLIDING, `window` W) a sequence's slices cover only its
last W positions, all of which its query sees: the cost is bounded by the window,
not the context. A soft-cap (SOFTCAP) is applied to each score in the softmax
step. With SINKS each head's sink logit joins the softmax sum once, where the
output is final: in pass 2, or in pass 1 with one split (`sink_share`); it is
read before the wait for the kernel in front (`sink_logit`). With these off the
kernels compile as without them.

The split count depends only on the batch shape, never on the context lengths,
so a captured CUDA graph stays valid: short contexts leave late splits empty.
An empty split writes only its log-sum-exp, -inf, and pass 2 reads no output
from it, so the empty splits of a short context cost next to nothing.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_attention_tile_shapes import decode_tiles, padded_head_dim
from nanovllm.kernels.triton_attention_tiles import (
    LOG2E,
    online_softmax_step,
    paged_kv_tile,
    paged_view,
    sink_logit,
    sink_share,
    tile_dtype,
)
from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel

_MAX_SPLITS = 32


# the window is a value, not a variant: specialising on it would compile one kernel for windows that are
# multiples of 16 and another for the rest
@triton.jit(do_not_specialize=["window"])
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_tables_ptr,
    context_lens_ptr,
    seq_order_ptr,
    sinks_ptr,
    o_ptr,
    lse_ptr,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_sb,
    stride_bt,
    stride_os,
    stride_oh,
    stride_osp,
    stride_ls,
    stride_lh,
    scale_log2,
    window,
    softcap_log2,
    PAGE: tl.constexpr,
    GROUP: tl.constexpr,
    QUERIES: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANTIZED: tl.constexpr,
    TILE_DTYPE: tl.constexpr,
    ORDERED: tl.constexpr,
    SLIDING: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    kv_head = tl.program_id(0)
    # rows: GROUP heads of each of the sequence's QUERIES queries, query-major
    r = tl.arange(0, ROWS_PAD)
    r_mask = r < GROUP * QUERIES
    heads = kv_head * GROUP + r % GROUP
    if SINKS and NUM_SPLITS == 1:  # the output is final here: the sink joins its sum at the end
        sink = sink_logit(sinks_ptr, heads)
    wait_for_previous_kernel(PDL)
    seq = tl.program_id(1)
    if ORDERED:
        seq = tl.load(seq_order_ptr + seq)
    split = tl.program_id(2)
    tokens = seq * QUERIES + r // GROUP  # each row's query token
    context_len = tl.load(context_lens_ptr + seq * QUERIES + QUERIES - 1)  # the last query sees the most
    first = 0  # the first position some query sees
    if SLIDING:
        first = tl.maximum(tl.load(context_lens_ptr + seq * QUERIES) - window, 0)
    tiles_per_split = tl.cdiv(tl.cdiv(context_len - first, BLOCK_N), NUM_SPLITS)
    start = first + split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, context_len)

    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    o_rows = tokens * stride_os + heads * stride_oh + split * stride_osp
    lse_rows = lse_ptr + tokens * stride_ls + heads * stride_lh + split
    if start < end:
        # q: [ROWS_PAD, BLOCK_D]
        q = tl.load(
            q_ptr + tokens[:, None] * stride_qs + heads[:, None] * stride_qh + d[None, :],
            mask=r_mask[:, None] & d_mask[None, :],
            other=0.0,
        ).to(TILE_DTYPE)
        if QUERIES > 1:
            # each row's own end (and window start): a sequence's earlier queries see fewer keys
            row_ends = tl.load(context_lens_ptr + tokens, mask=r_mask, other=0)
        m = tl.full([ROWS_PAD], float("-inf"), tl.float32)
        l = tl.zeros([ROWS_PAD], tl.float32)
        acc = tl.zeros([ROWS_PAD, BLOCK_D], tl.float32)
        for tile in range(start, end, BLOCK_N):
            pos = tile + tl.arange(0, BLOCK_N)
            pos_mask = pos < end
            # k, v: [BLOCK_N, BLOCK_D]
            k, v, k_scale, v_scale = paged_kv_tile(
                k_cache_ptr,
                v_cache_ptr,
                k_scale_ptr,
                v_scale_ptr,
                block_tables_ptr + seq * stride_bt,
                pos,
                pos_mask,
                kv_head,
                d,
                d_mask,
                stride_kb,
                stride_kt,
                stride_kh,
                stride_sb,
                q.dtype,
                PAGE,
                QUANTIZED,
            )
            seen = pos_mask[None, :]
            if QUERIES > 1:
                seen = seen & (pos[None, :] < row_ends[:, None])
                if SLIDING:
                    seen = seen & (pos[None, :] >= row_ends[:, None] - window)
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
                QUERIES > 1,  # an earlier query may see none of a slice's first tiles
            )
        if QUERIES > 1:
            l = tl.where(l > 0, l, 1.0)  # a row that saw no key of this slice: weight 0 (lse -inf) below
        out = acc / l[:, None]
        if SINKS and NUM_SPLITS == 1:
            out *= sink_share(sink, m + tl.log2(l))[:, None]
        tl.store(
            o_ptr + o_rows[:, None] + d[None, :], out.to(o_ptr.dtype.element_ty), mask=r_mask[:, None] & d_mask[None, :]
        )
        tl.store(lse_rows, m + tl.log2(l), mask=r_mask)
    else:
        # an empty slice (short contexts leave late ones empty) writes only its weight, zero: the
        # merge reads no output from it; with one slice the output is the result and reads zeros
        tl.store(lse_rows, tl.full([ROWS_PAD], float("-inf"), tl.float32), mask=r_mask)
        if NUM_SPLITS == 1:
            tl.store(
                o_ptr + o_rows[:, None] + d[None, :],
                tl.zeros([ROWS_PAD, BLOCK_D], o_ptr.dtype.element_ty),
                mask=r_mask[:, None] & d_mask[None, :],
            )


@triton.jit
def _merge_splits_kernel(
    partial_ptr,
    lse_ptr,
    sinks_ptr,
    o_ptr,
    stride_ps,
    stride_ph,
    stride_psp,
    stride_ls,
    stride_lh,
    stride_os,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SINKS: tl.constexpr,
    PDL: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    if SINKS:
        sink = sink_logit(sinks_ptr, head)
    wait_for_previous_kernel(PDL)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + seq * stride_ls + head * stride_lh + sp, mask=sp < NUM_SPLITS, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))  # empty slices weigh 0
    total = tl.sum(weight, 0)
    has_keys = lse > float("-inf")  # an empty slice wrote no output
    partial = tl.load(
        partial_ptr + seq * stride_ps + head * stride_ph + sp[:, None] * stride_psp + d[None, :],
        mask=has_keys[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    ).to(tl.float32)
    out = tl.sum(partial * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    if SINKS:  # the log-sum-exp of all the slices' scores: top + log2(total)
        out *= sink_share(sink, top + tl.log2(total))
    tl.store(o_ptr + seq * stride_os + head * stride_oh + d, out.to(o_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def default_num_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Enough context slices that seqs x kv_heads x splits programs fill every SM about twice."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return max(1, min(_MAX_SPLITS, triton.cdiv(2 * sms, num_seqs * num_kv_heads)))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    queries: int = 1,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each query row i over the first `context_lens[i]` cached tokens of its sequence ->
    [rows, heads, head_dim]; every sequence has `queries` rows, one after another (a verify step's last
    token and drafts, padded), and one row of `block_tables`.

    `block_n`, `num_warps` and `num_stages` are the split kernel's tile and launch settings, each by
    default `decode_tiles`'s for the head_dim, dtype and rows (benchmarks/decode_attention.py sweeps them).
    `k_scale`/`v_scale` come with an FP8 cache. `seq_order` (None: batch order) is the order the sequences start in,
    best longest context first; it is followed where the batch takes one split per sequence. `window`:
    the query sees only the last `window` positions; `softcap`: each score s becomes softcap * tanh(s / softcap);
    `sinks` ([heads]): each head's sink logit joins its softmax sum.
    """
    num_rows, num_heads, head_dim = q.shape
    num_seqs = num_rows // queries
    page, num_kv_heads = k_cache.size(1), k_cache.size(2)
    assert q.stride(2) == 1 and paged_view(k_cache, v_cache)
    if num_splits is None:
        num_splits = default_num_splits(num_seqs, num_kv_heads, q.device)
    group = num_heads // num_kv_heads
    block_d = padded_head_dim(head_dim)
    # partial: [rows, heads, splits, head_dim] -- with one split it is the output itself
    partial_dtype = q.dtype if num_splits == 1 else torch.float32
    partial = torch.empty(num_rows, num_heads, num_splits, head_dim, dtype=partial_dtype, device=q.device)
    lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    pdl = pdl_launch(q.device)
    quantized = k_scale is not None
    tiles = decode_tiles(head_dim, q.dtype, quantized, group * queries)
    if not quantized:  # never read: the scaling is compiled out
        k_scale = v_scale = lse
    # the order decides the tail when one split per sequence fills the SMs several times over; with
    # more, the slices are alike and reading the order would only add a load before the first tile
    ordered = seq_order is not None and num_splits == 1
    _decode_split_kernel[(num_kv_heads, num_seqs, num_splits)](
        q,
        k_cache,
        v_cache,
        k_scale,
        v_scale,
        block_tables,
        context_lens,
        seq_order if ordered else context_lens,
        lse if sinks is None else sinks,  # never read without sinks
        partial,
        lse,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_scale.stride(0),
        block_tables.stride(0),
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        scale * LOG2E,
        window or 0,
        (softcap or 0.0) * LOG2E,
        PAGE=page,
        GROUP=group,
        QUERIES=queries,
        ROWS_PAD=tiles.block_m,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=block_n or tiles.block_n,
        NUM_SPLITS=num_splits,
        PRECISION=precision,
        QUANTIZED=quantized,
        TILE_DTYPE=tile_dtype(q.dtype, quantized),
        ORDERED=ordered,
        SLIDING=window is not None,
        SOFTCAP=softcap is not None,
        SINKS=sinks is not None,
        num_warps=num_warps or tiles.num_warps,
        num_stages=num_stages or tiles.num_stages,
        **pdl,
    )
    if num_splits == 1:
        return partial.squeeze(2)
    out = torch.empty_like(q)
    _merge_splits_kernel[(num_rows, num_heads)](
        partial,
        lse,
        lse if sinks is None else sinks,  # never read without sinks
        out,
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
        SINKS=sinks is not None,
        **pdl,
    )
    return out
