"""Triton kernels: the gated delta rule of a prefill step in chunks, varlen, from and into the state slots.

The recurrence (`torch_gated_delta.py`), per value head with state S [dk, dv]:
S_t = exp(g_t) S_{t-1} + k_t u_t^T with u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t), o_t = S_t^T q_t.
Over a chunk of BT tokens starting from S, with G_i = g_1 + ... + g_i (cumulative within the chunk):

    S_i = exp(G_i) S + sum_{j <= i} exp(G_i - G_j) k_j u_j^T
    u_i + sum_{j < i} beta_i (k_i . k_j) exp(G_i - G_j) u_j = beta_i (v_i - exp(G_i) S^T k_i)

that is (I + A) U = beta (V - exp(G) K S) with A strictly lower triangular, hence with T = (I + A)^-1:

    U = T (beta (V - exp(G) K S))                               the chunk's corrected values
    O = exp(G) Q S + P U,     P_ij = (q_i . k_j) exp(G_i - G_j)  for j <= i
    S <- exp(G_last) S + (exp(G_last - G) K)^T U

Two kernels. The first, over every chunk of every sequence at once (grid: chunks, value heads), computes
the gates g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b), G, the inverse norms of q and k
(q's times dk ** -0.5; eps 1e-6, `l2_normalized`'s) and the chunk's T and P, which depend on the keys and
queries only. The second (grid: sequences, value heads, dv / BV) walks a sequence's chunks in order with
its state block S [dk, BV] in registers: it reads the slot's state, computes U, the outputs and the next
S per chunk, and writes the state back to the slot. Both multiply the raw q and k as they are read and
scale the products' rows and columns by the norms, so that the second kernel's tiles go from memory into
the products untouched.

T by blocks: the chunk is 4 blocks of C = BT / 4 tokens. Each diagonal block's inverse comes from forward
substitution (row i of (I + M)^-1 is e_i minus M's row i times the rows above it), then the two
half-chunks' inverses and the whole one from [[X, 0], [B, Y]]^-1 = [[X^-1, 0], [-Y^-1 B X^-1, Y^-1]].
The first kernel computes A on the whole chunk, writes it where T goes and reads it back by blocks (a
register tensor cannot be sliced). The inverse is not the series (I - A)(I + A^2)(I + A^4)...: A's powers
grow large for similar keys and beta near 1, and the product then cancels in fp32. Every exponent is a
difference G_i - G_j <= 0 (or G_i <= 0), so strong decays underflow to zero and never overflow.

Precision: the products run on bf16 tensor cores, exactly: a bf16 operand (q, k of a bf16 model) as it
is, an fp32 one (states, A, T, P, corrected values) as the sum of two bf16 halves (within 2^-17 of it),
the product of two low halves left out, accumulated in fp32: within about 1e-5 of an fp32 product, at two
or three bf16 products' cost (tf32x3 costs three tf32 ones, each half as fast). Plain tf32 or bf16 would
round keys, states and corrected values to 11 or 8 significant bits at every chunk, and the state carries
that error along the whole sequence. The diagonal inverses and everything elementwise are fp32.

Layout: q, k [tokens, key heads, dk], v [tokens, heads, dv] and a, b [tokens, heads] may be strided views
(last dimension contiguous); value head h reads key head h // (heads / key heads). state [slots, heads, dk,
dv] fp32 (dv contiguous). Per call the kernels share G and beta [tokens, heads] and the inverse norms
[tokens, key heads] in fp32, and T and P as their bf16 halves [chunks, heads, 4 (T hi, T lo, P hi, P lo),
BT, BT], zero above the diagonal; chunks are counted from each sequence's own start (the last one partial).
"""

import os

import torch
import triton
import triton.language as tl

_EPS = tl.constexpr(1e-6)
CHUNK = 64  # tokens per chunk: 4 blocks of 16, the smallest block a tensor-core product takes
# value columns of the state per program of the recurrence; with 4 warps and 2 stages (the next chunk's tiles
# loading during this one's products) it compiles for sm_90 to 253 registers, no spills and 157 KiB of shared memory
_BLOCK_V = 32


@triton.jit
def _halves(x):
    """fp32 x as hi + lo, two bf16 tensors: within 2^-17 of x."""
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _mm_halves(x_hi, x_lo, y, OPERAND: tl.constexpr):
    """(x_hi + x_lo) y in fp32 for bf16 halves of x: with y's own halves where y is fp32, the product of two low
    halves left out. OPERAND is the dtype the bf16 values meet in tl.dot: bf16, or fp32 in the interpreter (which
    multiplies bf16 tensors as their raw bits)."""
    x_hi, x_lo = x_hi.to(OPERAND), x_lo.to(OPERAND)
    if y.dtype == tl.bfloat16:
        y = y.to(OPERAND)
        out = tl.dot(x_hi, y, tl.dot(x_lo, y))
    else:
        y_hi, y_lo = _halves(y)
        out = tl.dot(x_hi, y_hi.to(OPERAND), tl.dot(x_hi, y_lo.to(OPERAND), tl.dot(x_lo, y_hi.to(OPERAND))))
    return out


@triton.jit
def _mm(x, y, OPERAND: tl.constexpr):
    """x y in fp32 from exact products of bf16 values: a bf16 operand as it is, an fp32 one as its halves."""
    if x.dtype == tl.bfloat16 and y.dtype == tl.bfloat16:
        out = tl.dot(x.to(OPERAND), y.to(OPERAND))
    elif x.dtype == tl.bfloat16:
        x = x.to(OPERAND)
        y_hi, y_lo = _halves(y)
        out = tl.dot(x, y_hi.to(OPERAND), tl.dot(x, y_lo.to(OPERAND)))
    else:
        x_hi, x_lo = _halves(x)
        out = _mm_halves(x_hi, x_lo, y, OPERAND)
    return out


@triton.jit
def _rows(ptr, rows, valid, stride_t, cols, col_valid):
    """Rows of q, k or v [rows, cols] as stored; zero past the sequence's end and the head's width."""
    return tl.load(ptr + rows[:, None] * stride_t + cols[None, :], mask=valid[:, None] & col_valid[None, :], other=0.0)


@triton.jit
def _inverse_norm(x):
    """1 / sqrt(sum(x^2) + eps) of each row of x [rows, BK], in fp32 (`l2_normalized`'s)."""
    x = x.to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=1) + _EPS)


@triton.jit
def _diagonal_inverse(m, C: tl.constexpr):
    """(I + m)^-1 of a strictly lower triangular block m [C, C], by forward substitution in fp32."""
    r = tl.arange(0, C)
    m_t = tl.trans(m)  # m's row i as column i, so that it lies along the rows of the inverse it weighs
    inverse = (r[:, None] == r[None, :]).to(tl.float32)
    for i in tl.static_range(1, C):
        weights = tl.sum(tl.where(r[None, :] == i, m_t, 0.0), axis=1)  # [C]: m[i, :]
        update = tl.sum(weights[:, None] * inverse, axis=0)  # [C]: m[i, :] times the rows above i
        inverse -= tl.where(r[:, None] == i, update[None, :], 0.0)
    return inverse


@triton.jit
def _load_block(hi_ptr, lo_ptr, square, i: tl.constexpr, j: tl.constexpr, C: tl.constexpr):
    """Block (i, j) [C, C] of a [4C, 4C] matrix held as its bf16 halves, in fp32 (`square`: the offsets of
    block (0, 0))."""
    at = square + (i * 4 * C + j) * C
    return tl.load(hi_ptr + at).to(tl.float32) + tl.load(lo_ptr + at).to(tl.float32)


@triton.jit
def _store_block(hi_ptr, lo_ptr, square, i: tl.constexpr, j: tl.constexpr, x, C: tl.constexpr):
    """Block (i, j) [C, C] of a [4C, 4C] matrix held as its bf16 halves, from x in fp32."""
    at = square + (i * 4 * C + j) * C
    hi, lo = _halves(x)
    tl.store(hi_ptr + at, hi)
    tl.store(lo_ptr + at, lo)


@triton.jit
def _inverse_by_blocks(hi_ptr, lo_ptr, C: tl.constexpr, OPERAND: tl.constexpr):
    """Overwrite the strictly lower triangular A [4C, 4C], held as its halves at hi_ptr and lo_ptr, with
    T = (I + A)^-1 (zero above the diagonal), the same way."""
    r = tl.arange(0, C)
    square = r[:, None] * (4 * C) + r[None, :]
    a10 = _load_block(hi_ptr, lo_ptr, square, 1, 0, C)
    a20 = _load_block(hi_ptr, lo_ptr, square, 2, 0, C)
    a21 = _load_block(hi_ptr, lo_ptr, square, 2, 1, C)
    a30 = _load_block(hi_ptr, lo_ptr, square, 3, 0, C)
    a31 = _load_block(hi_ptr, lo_ptr, square, 3, 1, C)
    a32 = _load_block(hi_ptr, lo_ptr, square, 3, 2, C)
    t00 = _diagonal_inverse(_load_block(hi_ptr, lo_ptr, square, 0, 0, C), C)
    t11 = _diagonal_inverse(_load_block(hi_ptr, lo_ptr, square, 1, 1, C), C)
    t22 = _diagonal_inverse(_load_block(hi_ptr, lo_ptr, square, 2, 2, C), C)
    t33 = _diagonal_inverse(_load_block(hi_ptr, lo_ptr, square, 3, 3, C), C)
    # the half-chunks: [[a00, 0], [a10, a11]] -> [[t00, 0], [-t11 a10 t00, t11]], and the same below
    t10 = -_mm(t11, _mm(a10, t00, OPERAND), OPERAND)
    t32 = -_mm(t33, _mm(a32, t22, OPERAND), OPERAND)
    # the lower-left quarter: -(lower half's inverse) [[a20, a21], [a30, a31]] (upper half's inverse)
    x20 = _mm(a20, t00, OPERAND) + _mm(a21, t10, OPERAND)
    x21 = _mm(a21, t11, OPERAND)
    x30 = _mm(a30, t00, OPERAND) + _mm(a31, t10, OPERAND)
    x31 = _mm(a31, t11, OPERAND)
    t20 = -_mm(t22, x20, OPERAND)
    t21 = -_mm(t22, x21, OPERAND)
    t30 = -(_mm(t32, x20, OPERAND) + _mm(t33, x30, OPERAND))
    t31 = -(_mm(t32, x21, OPERAND) + _mm(t33, x31, OPERAND))
    tl.debug_barrier()  # every thread has read A before any writes over it
    _store_block(hi_ptr, lo_ptr, square, 0, 0, t00, C)
    _store_block(hi_ptr, lo_ptr, square, 1, 0, t10, C)
    _store_block(hi_ptr, lo_ptr, square, 1, 1, t11, C)
    _store_block(hi_ptr, lo_ptr, square, 2, 0, t20, C)
    _store_block(hi_ptr, lo_ptr, square, 2, 1, t21, C)
    _store_block(hi_ptr, lo_ptr, square, 2, 2, t22, C)
    _store_block(hi_ptr, lo_ptr, square, 3, 0, t30, C)
    _store_block(hi_ptr, lo_ptr, square, 3, 1, t31, C)
    _store_block(hi_ptr, lo_ptr, square, 3, 2, t32, C)
    _store_block(hi_ptr, lo_ptr, square, 3, 3, t33, C)


@triton.jit(do_not_specialize=["num_seqs"])  # one compile for every count
def _chunk_prepare_kernel(
    q_ptr,
    k_ptr,
    a_ptr,
    b_ptr,
    a_log_ptr,
    dt_bias_ptr,
    chunk_seq_ptr,
    starts_ptr,
    ends_ptr,
    cu_chunks_ptr,
    g_ptr,
    beta_ptr,
    qn_ptr,
    kn_ptr,
    matrices_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_at,
    stride_bt,
    num_seqs,
    scale,
    HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    BK: tl.constexpr,
    C: tl.constexpr,
    OPERAND: tl.constexpr,
):
    chunk = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(chunk_seq_ptr + chunk)
    if seq >= num_seqs:  # past the step's last chunk: the grid counts the most chunks there can be
        return
    BT: tl.constexpr = 4 * C
    end = tl.load(ends_ptr + seq).to(tl.int64)
    start = tl.load(starts_ptr + seq) + (chunk - tl.load(cu_chunks_ptr + seq)) * BT
    r = tl.arange(0, BT)
    rows = start.to(tl.int64) + r
    valid = rows < end
    key_head = head // GROUP
    cols = tl.arange(0, BK)
    q = _rows(q_ptr + key_head * stride_qh, rows, valid, stride_qt, cols, cols < DK)  # [BT, BK], raw
    k = _rows(k_ptr + key_head * stride_kh, rows, valid, stride_kt, cols, cols < DK)
    q_norm = _inverse_norm(q) * scale  # [BT]
    k_norm = _inverse_norm(k)
    # past the sequence's end g = beta = 0, which leaves the chunk's real tokens as they are
    x = tl.load(a_ptr + rows * stride_at + head, mask=valid, other=0.0).to(tl.float32) + tl.load(dt_bias_ptr + head)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # torch's threshold
    g = tl.where(valid, -tl.exp(tl.load(a_log_ptr + head)) * softplus, 0.0)
    G = tl.cumsum(g, axis=0)
    beta = tl.where(
        valid, tl.sigmoid(tl.load(b_ptr + rows * stride_bt + head, mask=valid, other=0.0).to(tl.float32)), 0.0
    )
    tl.store(g_ptr + rows * HEADS + head, G, mask=valid)
    tl.store(beta_ptr + rows * HEADS + head, beta, mask=valid)
    first = head % GROUP == 0  # a group's first head stores its key head's norms
    tl.store(qn_ptr + rows * (HEADS // GROUP) + key_head, q_norm, mask=valid & first)
    tl.store(kn_ptr + rows * (HEADS // GROUP) + key_head, k_norm, mask=valid & first)

    # G_i - G_j <= 0 on and below the diagonal; the minimum trims the scan's rounding and the exponent above it
    decay = tl.exp(tl.minimum(G[:, None] - G[None, :], 0.0)) * k_norm[None, :]  # [BT, BT]
    k_t = tl.trans(k)
    a = _mm(k, k_t, OPERAND) * ((beta * k_norm)[:, None] * decay)
    p = _mm(q, k_t, OPERAND) * (q_norm[:, None] * decay)
    # this chunk's and head's [BT, BT] matrices: the halves of T, then those of P
    matrix = matrices_ptr + (chunk * HEADS + head).to(tl.int64) * (4 * BT * BT)
    square = r[:, None] * BT + r[None, :]
    p_hi, p_lo = _halves(tl.where(r[:, None] >= r[None, :], p, 0.0))
    tl.store(matrix + 2 * BT * BT + square, p_hi)
    tl.store(matrix + 3 * BT * BT + square, p_lo)
    a_hi, a_lo = _halves(tl.where(r[:, None] > r[None, :], a, 0.0))  # A goes through T's place
    tl.store(matrix + square, a_hi)
    tl.store(matrix + BT * BT + square, a_lo)
    tl.debug_barrier()  # A is read back by blocks, which other threads wrote
    _inverse_by_blocks(matrix, matrix + BT * BT, C, OPERAND)


@triton.jit
def _chunk_recur_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    qn_ptr,
    kn_ptr,
    matrices_ptr,
    state_ptr,
    slots_ptr,
    starts_ptr,
    ends_ptr,
    cu_chunks_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ss,
    stride_sh,
    stride_sk,
    HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    OPERAND: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    cols_v = tl.program_id(2) * BV + tl.arange(0, BV)
    cols_k = tl.arange(0, BK)
    valid_v = cols_v < DV
    valid_k = cols_k < DK
    seq_start = tl.load(starts_ptr + seq).to(tl.int64)
    end = tl.load(ends_ptr + seq).to(tl.int64)
    first_chunk = tl.load(cu_chunks_ptr + seq)
    last_chunk = tl.load(cu_chunks_ptr + seq + 1)
    key_head = head // GROUP
    q_ptr += key_head * stride_qh
    k_ptr += key_head * stride_kh
    qn_ptr += key_head
    kn_ptr += key_head
    v_ptr += head * stride_vh
    r = tl.arange(0, BT)

    slot = tl.load(slots_ptr + seq).to(tl.int64)
    state_ptrs = state_ptr + slot * stride_ss + head * stride_sh + cols_k[:, None] * stride_sk + cols_v[None, :]
    state_mask = valid_k[:, None] & valid_v[None, :]
    state = tl.load(state_ptrs, mask=state_mask, other=0.0)  # [BK, BV]
    for chunk in range(first_chunk, last_chunk):
        rows = seq_start + (chunk - first_chunk) * BT + r
        valid = rows < end
        k = _rows(k_ptr, rows, valid, stride_kt, cols_k, valid_k)  # [BT, BK], raw
        q = _rows(q_ptr, rows, valid, stride_qt, cols_k, valid_k)
        v = _rows(v_ptr, rows, valid, stride_vt, cols_v, valid_v).to(tl.float32)  # [BT, BV]
        k_norm = tl.load(kn_ptr + rows * (HEADS // GROUP), mask=valid, other=0.0)  # [BT]
        q_norm = tl.load(qn_ptr + rows * (HEADS // GROUP), mask=valid, other=0.0)
        G = tl.load(g_ptr + rows * HEADS + head, mask=valid, other=0.0)  # <= 0
        beta = tl.load(beta_ptr + rows * HEADS + head, mask=valid, other=0.0)
        G_last = tl.min(G, axis=0)
        # [BT, BT] bf16 halves of T and of P, zero above the diagonal
        matrix = matrices_ptr + (chunk * HEADS + head).to(tl.int64) * (4 * BT * BT) + r[:, None] * BT + r[None, :]
        t_hi = tl.load(matrix)
        t_lo = tl.load(matrix + BT * BT)
        p_hi = tl.load(matrix + 2 * BT * BT)
        p_lo = tl.load(matrix + 3 * BT * BT)

        decay = tl.exp(G)
        held = _mm(k, state, OPERAND) * (decay * k_norm)[:, None]  # [BT, BV]: exp(G) K S
        u = _mm_halves(t_hi, t_lo, beta[:, None] * (v - held), OPERAND)  # the corrected values
        out = _mm_halves(p_hi, p_lo, u, OPERAND) + _mm(q, state, OPERAND) * (decay * q_norm)[:, None]
        tl.store(
            out_ptr + (rows[:, None] * HEADS + head) * DV + cols_v[None, :], out, mask=valid[:, None] & valid_v[None, :]
        )
        written = u * (tl.exp(G_last - G) * k_norm)[:, None]
        state = tl.exp(G_last) * state + _mm(tl.trans(k), written, OPERAND)
    tl.store(state_ptrs, state, mask=state_mask)


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    chunk_size: int = CHUNK,
    seqs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gated delta rule over each sequence's tokens (rows cu_seqlens[s] .. cu_seqlens[s + 1]) from the state
    in its slot, the state after its last token written back there; returns the fp32 outputs. q and k are
    raw (normalised here), the decay is -exp(A_log) softplus(a + dt_bias) and the write strength sigmoid(b),
    all in fp32. `chunk_size` is 4 blocks of at least 16 tokens on the GPU (any multiple of 4 in the
    interpreter); `max_seqlen` only bounds the number of chunks. With `seqs`, only those sequences run: the
    others' output rows are left unwritten and their slots untouched."""
    # q, k: [tokens, key heads, dk]; v: [tokens, heads, dv]; a, b: [tokens, heads]; A_log, dt_bias: [heads] fp32;
    # state: [slots, heads, dk, dv] fp32; slots: [seqs] int64; cu_seqlens: [seqs + 1] int32; seqs: [n] int64
    # -> [tokens, heads, dv]
    tokens, key_heads, dk = q.shape
    heads, dv = v.shape[1:]
    block = chunk_size // 4
    if chunk_size % 4 or (q.is_cuda and block < 16):
        raise ValueError(f"chunk_size {chunk_size} is not 4 blocks of a size the device's products take")
    if state.dtype != torch.float32 or state.stride(-1) != 1:
        raise ValueError("the state must be fp32 with its value dimension contiguous")
    q, k, v, a, b = (_last_contiguous(x) for x in (q, k, v, a, b))
    device = v.device
    out = torch.empty(tokens, heads, dv, dtype=torch.float32, device=device)
    # [seqs] each, new tensors (a view one entry into cu_seqlens is not 16-byte aligned, and Triton compiles a
    # kernel variant per alignment: a step's first subset would pay a second compile)
    if seqs is None:
        starts, ends = cu_seqlens[:-1].clone(), cu_seqlens[1:].clone()
    else:
        starts, ends, slots = cu_seqlens[:-1][seqs], cu_seqlens[1:][seqs], slots[seqs]
    num_seqs = slots.numel()
    if tokens == 0 or num_seqs == 0:
        return out
    # each sequence's first chunk, and the sequence of each chunk the grid may hold (num_seqs past the last)
    lengths = ends - starts
    cu_chunks = torch.zeros(num_seqs + 1, dtype=torch.int32, device=device)
    cu_chunks[1:] = torch.cumsum(torch.div(lengths + chunk_size - 1, chunk_size, rounding_mode="floor"), 0)
    most_chunks = min(tokens // chunk_size + num_seqs, num_seqs * triton.cdiv(max_seqlen, chunk_size))
    chunk_ids = torch.arange(most_chunks, dtype=torch.int32, device=device)
    chunk_seq = torch.searchsorted(cu_chunks[1:], chunk_ids, right=True, out_int32=True)

    gates = torch.empty(2, tokens, heads, dtype=torch.float32, device=device)  # G, beta
    norms = torch.empty(2, tokens, key_heads, dtype=torch.float32, device=device)  # q's, k's inverse norms
    # T's and P's bf16 halves per chunk and head
    matrices = torch.empty(most_chunks, heads, 4, chunk_size, chunk_size, dtype=torch.bfloat16, device=device)
    group, block_k = heads // key_heads, triton.next_power_of_2(dk)
    operand = tl.bfloat16 if q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1" else tl.float32
    _chunk_prepare_kernel[(most_chunks, heads)](
        q, k, a, b, A_log, dt_bias, chunk_seq, starts, ends, cu_chunks, *gates, *norms, matrices,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), a.stride(0), b.stride(0), num_seqs, dk**-0.5,
        HEADS=heads, GROUP=group, DK=dk, BK=block_k, C=block, OPERAND=operand, num_warps=4,
    )  # fmt: skip
    block_v = min(_BLOCK_V, triton.next_power_of_2(dv))
    _chunk_recur_kernel[(num_seqs, heads, triton.cdiv(dv, block_v))](
        q, k, v, *gates, *norms, matrices, state, slots, starts, ends, cu_chunks, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        state.stride(0), state.stride(1), state.stride(2),
        HEADS=heads, GROUP=group, DK=dk, DV=dv, BK=block_k, BV=block_v, BT=chunk_size, OPERAND=operand,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return out
