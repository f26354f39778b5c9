"""Triton kernel: per-head RMSNorm (Qwen3's q/k norm, optional), rotary embedding of q and k, and the
store of this step's K/V into the paged cache, one launch.

Layout: q [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim]
(rows and heads may be strided, each head's values contiguous, as views of the
QKV projection's output are); positions [tokens] (int); cos_sin
[max_position, 2, rotary_dim] fp32, the rotate-half table over each head's
first rotary_dim dimensions (all of them, or fewer for a partial rotary
factor, whose remaining dimensions pass through unrotated); q_weight, k_weight
[head_dim]; k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim],
each block contiguous and the blocks `stride(0)` apart (`paged_view`), so flat
slot s of head h starts at (s // block_size) * stride(0) + ((s % block_size) *
kv_heads + h) * head_dim; slot_mapping [tokens], -1 = store nothing (a padded
CUDA-graph row, or a token whose K/V is already cached). The rotated q and k are new contiguous tensors of
q's and k's shapes. Grid: (tokens, kv_heads / KV_PER_PROGRAM): a program
takes KV_PER_PROGRAM KV heads of one token and their query heads; it
normalises and rotates the q heads and then the k heads, [heads, rotary_dim / 2]
halves at a time (and, for a partial rotary, the pass-through part, which
HEAD_DIM > 2 * HALF compiles in), and with a cache writes the rotated k heads and the v heads
to the token's slot. Up to 16 tokens a program takes one KV head, so that a
small decode step's heads run side by side; past that it takes all of them,
reading the position's cos/sin row and the norm weights once per token and
writing one contiguous kv_heads x head_dim row of each cache: a 256-row decode
step launches 256 programs of 4 warps rather than thousands of one-warp
programs of one head each.

An FP8 cache (QUANTIZED, with k_scale, v_scale: [num_blocks, kv_heads,
block_size] fp32) stores each k or v head as float8 values and its scale,
amax / 448, computed from the head's values in the model's dtype as
`kernels/fp8_kv.quantize_heads` computes them.

The arithmetic is the plain-PyTorch reference's
(`layers/rotary_embedding.norm_rotate_qk_reference`): the norm in fp32, its
result and the cos/sin table rounded to the model's dtype where the reference
rounds them, the rotation in fp32 (as the compiled reference does it). It is
one launch rather than two generated kernels and a store per layer, since in a
decode step of one sequence each launch in that chain costs its latency.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.fp8_kv import FP8_MAX
from nanovllm.kernels.triton_attention_tiles import paged_view
from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel

_FP8_MAX = tl.constexpr(FP8_MAX)
_FEW_TOKENS = 16


@triton.jit
def _load_heads(rows, both, pass_rows, pass_both, other, dtype, HEAD_DIM: tl.constexpr, HALF: tl.constexpr):
    """The heads' rotated halves x1, x2 [HEADS, BLOCK] from `rows` (pointers to the first half) and, for a
    partial rotary, the dimensions that pass through, x3 [HEADS, PASS_BLOCK] from `pass_rows` (x1 again for
    a full one: unread), as `dtype`; masked lanes read `other`."""
    x1 = tl.load(rows, mask=both, other=other).to(dtype)
    x2 = tl.load(rows + HALF, mask=both, other=other).to(dtype)
    x3 = x1
    if HEAD_DIM > 2 * HALF:
        x3 = tl.load(pass_rows, mask=pass_both, other=other).to(dtype)
    return x1, x2, x3


@triton.jit
def _norm_rotate_heads(
    source,
    stride_h,
    target,
    heads,
    head_mask,
    lanes,
    mask,
    pass_lanes,
    pass_mask,
    cos,
    sin,
    w1,
    w2,
    w3,
    eps,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    NORM: tl.constexpr,
):
    """Normalise (with NORM) and rotate the heads `heads` [HEADS] of one token at `source`, write them
    contiguously at `target` and return their rotated halves y1, y2 [HEADS, BLOCK] and their pass-through
    dimensions y3 [HEADS, PASS_BLOCK] (partial rotary only) in the model's dtype."""
    dtype = target.dtype.element_ty
    partial: tl.constexpr = HEAD_DIM > 2 * HALF
    both = head_mask[:, None] & mask[None, :]
    pass_both = head_mask[:, None] & pass_mask[None, :]
    # offsets summed before they are added to the pointer, so that a full rotary compiles to the code it
    # would without the pass-through part
    x1, x2, x3 = _load_heads(
        source + (heads[:, None] * stride_h + lanes[None, :]),
        both,
        source + (heads[:, None] * stride_h + 2 * HALF + pass_lanes[None, :]),
        pass_both,
        0.0,
        tl.float32,
        HEAD_DIM,
        HALF,
    )
    if NORM:
        squares = tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)
        if partial:
            squares += tl.sum(x3 * x3, 1)
        rstd = tl.rsqrt(squares / HEAD_DIM + eps)[:, None]
        x1 = (w1[None, :] * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        x2 = (w2[None, :] * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        if partial:
            x3 = (w3[None, :] * (x3 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    y1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype)
    y2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype)
    y3 = x3.to(dtype)
    out = heads[:, None] * HEAD_DIM + lanes[None, :]
    tl.store(target + out, y1, mask=both)
    tl.store(target + out + HALF, y2, mask=both)
    if partial:
        tl.store(target + heads[:, None] * HEAD_DIM + 2 * HALF + pass_lanes[None, :], y3, mask=pass_both)
    return y1, y2, y3


@triton.jit
def _store_heads(
    x1,
    x2,
    x3,
    cache_ptr,
    scale_ptr,
    slot,
    kv_heads,
    head_mask,
    lanes,
    mask,
    pass_lanes,
    pass_mask,
    stride_cb,
    stride_sb,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    PAGE: tl.constexpr,
    QUANTIZED: tl.constexpr,
):
    """Write the KV heads `kv_heads` of one token, halves x1 and x2 [HEADS, BLOCK] and (for a partial
    rotary) the rest x3 [HEADS, PASS_BLOCK] in the model's dtype, to flat slot `slot` (quantized for an FP8
    cache: one scale per head)."""
    partial: tl.constexpr = HEAD_DIM > 2 * HALF
    block = (slot // PAGE).to(tl.int64)
    row = cache_ptr + block * stride_cb + (slot % PAGE) * (NUM_KV_HEADS * HEAD_DIM)
    target = row + kv_heads[:, None] * HEAD_DIM + lanes[None, :]
    both = head_mask[:, None] & mask[None, :]
    pass_both = head_mask[:, None] & pass_mask[None, :]
    if QUANTIZED:
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        x3 = x3.to(tl.float32)
        amax = tl.maximum(tl.max(tl.where(both, tl.abs(x1), 0.0), 1), tl.max(tl.where(both, tl.abs(x2), 0.0), 1))
        if partial:
            amax = tl.maximum(amax, tl.max(tl.where(pass_both, tl.abs(x3), 0.0), 1))
        scale = tl.where(amax > 0, amax / _FP8_MAX, 1.0)  # [HEADS]
        tl.store(scale_ptr + block * stride_sb + kv_heads * PAGE + slot % PAGE, scale, mask=head_mask)
        x1 = x1 / scale[:, None]
        x2 = x2 / scale[:, None]
        x3 = x3 / scale[:, None]
    tl.store(target, x1.to(cache_ptr.dtype.element_ty), mask=both)
    tl.store(target + HALF, x2.to(cache_ptr.dtype.element_ty), mask=both)
    if partial:
        pass_target = row + kv_heads[:, None] * HEAD_DIM + 2 * HALF + pass_lanes[None, :]
        tl.store(pass_target, x3.to(cache_ptr.dtype.element_ty), mask=pass_both)


@triton.jit
def _norm_rotate_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    k_out_ptr,
    positions_ptr,
    cos_sin_ptr,
    q_weight_ptr,
    k_weight_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    slot_mapping_ptr,
    eps,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_sb,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    KV_PER_PROGRAM: tl.constexpr,
    Q_PER_PROGRAM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    PASS_BLOCK: tl.constexpr,
    PAGE: tl.constexpr,
    NORM: tl.constexpr,
    STORE: tl.constexpr,
    QUANTIZED: tl.constexpr,
    PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    mask = lanes < HALF
    # a partial rotary's dimensions after the rotated ones, which pass through (counted from 2 * HALF)
    pass_lanes = tl.arange(0, PASS_BLOCK)
    pass_mask = pass_lanes < HEAD_DIM - 2 * HALF
    # this program's KV heads and their query heads
    heads = tl.program_id(1) * Q_PER_PROGRAM + tl.arange(0, HEADS_PAD)
    q_mask = (tl.arange(0, HEADS_PAD) < Q_PER_PROGRAM) & (heads < NUM_HEADS)
    kv_heads = tl.program_id(1) * KV_PER_PROGRAM + tl.arange(0, KV_HEADS_PAD)
    kv_mask = (tl.arange(0, KV_HEADS_PAD) < KV_PER_PROGRAM) & (kv_heads < NUM_KV_HEADS)
    # No kernel writes the slots, positions, table or weights: they are read before waiting for
    # the previous kernel (under PDL, while it runs).
    slot = -1
    if STORE:
        slot = tl.load(slot_mapping_ptr + token)
    table = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * (4 * HALF)
    # rotate-half: the table repeats its frequencies over both halves
    dtype = q_out_ptr.dtype.element_ty
    cos = tl.load(table + lanes, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(table + 2 * HALF + lanes, mask=mask, other=0.0).to(dtype).to(tl.float32)
    qw1, qw2, qw3, kw1, kw2, kw3 = cos, cos, cos, cos, cos, cos  # read only with NORM
    if NORM:
        qw1, qw2, qw3 = _load_heads(
            q_weight_ptr + lanes, mask, q_weight_ptr + 2 * HALF + pass_lanes, pass_mask, 0.0, tl.float32, HEAD_DIM, HALF
        )
        kw1, kw2, kw3 = _load_heads(
            k_weight_ptr + lanes, mask, k_weight_ptr + 2 * HALF + pass_lanes, pass_mask, 0.0, tl.float32, HEAD_DIM, HALF
        )
    wait_for_previous_kernel(PDL)
    _norm_rotate_heads(
        q_ptr + token * stride_qt,
        stride_qh,
        q_out_ptr + token * NUM_HEADS * HEAD_DIM,
        heads,
        q_mask,
        lanes,
        mask,
        pass_lanes,
        pass_mask,
        cos,
        sin,
        qw1,
        qw2,
        qw3,
        eps,
        HEAD_DIM,
        HALF,
        NORM,
    )
    k1, k2, k3 = _norm_rotate_heads(
        k_ptr + token * stride_kt,
        stride_kh,
        k_out_ptr + token * NUM_KV_HEADS * HEAD_DIM,
        kv_heads,
        kv_mask,
        lanes,
        mask,
        pass_lanes,
        pass_mask,
        cos,
        sin,
        kw1,
        kw2,
        kw3,
        eps,
        HEAD_DIM,
        HALF,
        NORM,
    )
    if slot >= 0:  # the rotated k and the v heads into the cache
        _store_heads(
            k1,
            k2,
            k3,
            k_cache_ptr,
            k_scale_ptr,
            slot,
            kv_heads,
            kv_mask,
            lanes,
            mask,
            pass_lanes,
            pass_mask,
            stride_cb,
            stride_sb,
            NUM_KV_HEADS,
            HEAD_DIM,
            HALF,
            PAGE,
            QUANTIZED,
        )
        v_rows = v_ptr + token * stride_vt + kv_heads[:, None] * stride_vh
        v1, v2, v3 = _load_heads(
            v_rows + lanes[None, :],
            kv_mask[:, None] & mask[None, :],
            v_rows + 2 * HALF + pass_lanes[None, :],
            kv_mask[:, None] & pass_mask[None, :],
            None,  # masked lanes are not stored
            v_ptr.dtype.element_ty,
            HEAD_DIM,
            HALF,
        )
        _store_heads(
            v1,
            v2,
            v3,
            v_cache_ptr,
            v_scale_ptr,
            slot,
            kv_heads,
            kv_mask,
            lanes,
            mask,
            pass_lanes,
            pass_mask,
            stride_cb,
            stride_sb,
            NUM_KV_HEADS,
            HEAD_DIM,
            HALF,
            PAGE,
            QUANTIZED,
        )


def norm_rotate_store(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    v: torch.Tensor | None = None,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated at `positions`, each head RMS-normalised first when weights are given; given v and
    the caches, the rotated k and v are also written at `slot_mapping` (-1 skipped), quantized where
    the scales of an FP8 cache are given."""
    # positions, slot_mapping: [tokens]; q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.size(1)
    store = k_cache is not None
    v = v if store else k
    rotary_dim = cos_sin.size(-1)  # the leading dimensions of each head that turn; the rest pass through
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and rotary_dim % 2 == 0
    assert cos_sin.is_contiguous() and rotary_dim <= head_dim
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    norm = q_weight is not None
    if store:
        assert paged_view(k_cache, v_cache) and k_cache.shape[-2:] == (num_kv_heads, head_dim)
    quantized = k_scale is not None
    # few tokens: a program per KV head (with its query heads), so that one token's heads run side by
    # side; many: a program per token, which reads the table row and the weights once
    kv_per_program = 1 if num_tokens <= _FEW_TOKENS else num_kv_heads
    q_per_program = kv_per_program * num_heads // num_kv_heads
    _norm_rotate_store_kernel[(num_tokens, num_kv_heads // kv_per_program)](
        q,
        k,
        v,
        q_out,
        k_out,
        positions,
        cos_sin,
        q_weight if norm else q,
        k_weight if norm else k,
        k_cache if store else k,
        v_cache if store else v,
        k_scale if quantized else q,
        v_scale if quantized else q,
        slot_mapping if store else positions,
        eps,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0) if store else 0,
        k_scale.stride(0) if quantized else 0,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        KV_PER_PROGRAM=kv_per_program,
        Q_PER_PROGRAM=q_per_program,
        HEADS_PAD=triton.next_power_of_2(q_per_program),
        KV_HEADS_PAD=triton.next_power_of_2(kv_per_program),
        HEAD_DIM=head_dim,
        HALF=rotary_dim // 2,
        BLOCK=triton.next_power_of_2(rotary_dim // 2),
        PASS_BLOCK=triton.next_power_of_2(max(head_dim - rotary_dim, 1)),
        PAGE=k_cache.size(1) if store else 1,
        NORM=norm,
        STORE=store,
        QUANTIZED=quantized,
        num_warps=1 if kv_per_program == 1 else 4,
        **pdl_launch(q.device),
    )
    return q_out, k_out
