"""Triton kernel: the gated delta rule token by token (Gated DeltaNet's recurrence), in place on the state slots.

For decode and verify steps (`queries_per_seq` tokens per sequence, one after another) and for varlen steps
(`cu_seqlens` delimits the sequences) that keep the state after each token. The math is that of
`torch_gated_delta.gated_delta_rule`, with the layer's gate fused: from the projection's raw a and b,
g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), both in fp32.

Layouts: q, k [tokens, key_heads, dk]; v [tokens, heads, dv]; a, b [tokens, heads] (any of them a strided
view of the fused projection's output, each head's values contiguous); state [slots_total, heads, dk, dv]
fp32; slots [seqs] int64; step_states [seqs, S, heads, dk, dv] fp32; out [tokens, heads, dv] fp32.

Grid (seqs, heads, cdiv(dv, BV)): a program keeps one value head's [dk, BV] slice of its sequence's state in
registers across the sequence's tokens, and writes it back once at the end. Each program normalises the
token's q and k itself: the few dk values cost less than a second pass over them. The grid and every
buffer follow from the shapes alone and nothing waits on the host, so a decode step can be captured in a
CUDA graph.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel

_BLOCK_V = 64  # value columns of the state per program: the fastest of 8 to 64 (docs/tuning.md)
_NUM_WARPS = 4
_L2_EPS = tl.constexpr(1e-6)  # as torch_gated_delta.l2_normalized
_SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # torch.nn.functional.softplus: linear above it


@triton.jit
def _softplus(x):
    """log(1 + exp(x)) as torch.nn.functional.softplus gives it: x itself above the threshold. log1p by
    log(u) * y / (u - 1) with u = 1 + y, which keeps the digits that 1 + y rounds away for a small y."""
    y = tl.exp(tl.minimum(x, _SOFTPLUS_THRESHOLD))  # the branch not taken stays finite
    u = 1.0 + y
    log1p = tl.where(u == 1.0, y, tl.log(u) * (y / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > _SOFTPLUS_THRESHOLD, x, log1p)


@triton.jit
def _l2_normalized(x):
    """x / sqrt(sum(x^2) + eps) of a vector (its masked entries zero)."""
    return x * tl.rsqrt(tl.sum(x * x, axis=0) + _L2_EPS)


@triton.jit(do_not_specialize=["num_steps"])  # one compile for every count
def _gated_delta_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    A_log_ptr,
    dt_bias_ptr,
    state_ptr,
    slots_ptr,
    cu_seqlens_ptr,
    steps_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_at,
    stride_ah,
    stride_bt,
    stride_bh,
    stride_ss,
    stride_sh,
    stride_sk,
    stride_ps,
    stride_pj,
    stride_ph,
    stride_pk,
    stride_ot,
    stride_oh,
    num_steps,
    scale,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    QUERIES: tl.constexpr,
    VARLEN: tl.constexpr,
    STEPS: tl.constexpr,
    WRITE_STATE: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    key_head = head // GROUP
    kd = tl.arange(0, BK)
    vd = tl.program_id(2) * BV + tl.arange(0, BV)
    k_mask = kd < DK
    v_mask = vd < DV
    tile_mask = k_mask[:, None] & v_mask[None, :]
    if VARLEN:
        start = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
        length = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64) - start
    else:
        start = seq * QUERIES
        length = QUERIES
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    state_tile = state_ptr + slot * stride_ss + head * stride_sh + kd[:, None] * stride_sk + vd[None, :]
    steps_tile = steps_ptr + seq * stride_ps + head * stride_ph + kd[:, None] * stride_pk + vd[None, :]
    # s: [BK, BV], this head's state at the program's value columns
    s = tl.load(state_tile, mask=tile_mask, other=0.0)
    decay_rate = -tl.exp(tl.load(A_log_ptr + head))
    dt_bias = tl.load(dt_bias_ptr + head)
    for j in range(0, length):
        t = start + j
        q = tl.load(q_ptr + t * stride_qt + key_head * stride_qh + kd, mask=k_mask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * stride_kt + key_head * stride_kh + kd, mask=k_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * stride_vt + head * stride_vh + vd, mask=v_mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + t * stride_at + head * stride_ah).to(tl.float32)
        b = tl.load(b_ptr + t * stride_bt + head * stride_bh).to(tl.float32)
        q = _l2_normalized(q) * scale
        k = _l2_normalized(k)
        g = decay_rate * _softplus(a + dt_bias)
        beta = 1.0 / (1.0 + tl.exp(-b))
        s = s * tl.exp(g)
        held = tl.sum(k[:, None] * s, axis=0)  # [BV], what the state holds at k
        s = s + k[:, None] * ((v - held) * beta)[None, :]
        tl.store(out_ptr + t * stride_ot + head * stride_oh + vd, tl.sum(q[:, None] * s, axis=0), mask=v_mask)
        if STEPS:
            tl.store(steps_tile + j * stride_pj, s, mask=tile_mask & (j < num_steps))
    if STEPS:  # past a short sequence's end its last state, as padding tokens (g = 0, beta = 0) would leave it
        for j in range(length, num_steps):
            tl.store(steps_tile + j * stride_pj, s, mask=tile_mask)
    if WRITE_STATE:
        tl.store(state_tile, s, mask=tile_mask)


def gated_delta_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    queries_per_seq: int = 1,
    step_states: torch.Tensor | None = None,
    write_state: bool = True,
) -> torch.Tensor:
    """The gated delta rule over each sequence's tokens from the state in its slot, with beta = sigmoid(b) and
    g = -exp(A_log) * softplus(a + dt_bias); fp32 outputs [tokens, heads, dv].

    The sequences are those `cu_seqlens` ([seqs + 1] int32) delimits, or without it rows of `queries_per_seq`
    tokens each. Sequence s starts from state[slots[s]]; with `write_state` the state after its last token goes
    back there (a verify step leaves the live slots alone). `step_states`, where given, receives the state after
    each of a sequence's first S tokens at row (s, j), and past a shorter sequence's end its last state."""
    # q, k: [tokens, key_heads, dk]; v: [tokens, heads, dv]; a, b: [tokens, heads]; A_log, dt_bias: [heads] fp32;
    # state: [slots_total, heads, dk, dv] fp32; slots: [seqs]; step_states: [seqs, S, heads, dk, dv] fp32
    tokens, key_heads, dk = q.shape
    heads, dv = v.shape[1:]
    num_seqs = slots.numel()
    assert k.shape == q.shape and v.size(0) == tokens and heads % key_heads == 0
    assert a.shape == b.shape == (tokens, heads) and A_log.shape == dt_bias.shape == (heads,)
    assert A_log.dtype == dt_bias.dtype == torch.float32
    assert state.shape[1:] == (heads, dk, dv) and state.dtype == torch.float32
    assert q.stride(2) == k.stride(2) == v.stride(2) == state.stride(3) == 1
    if cu_seqlens is None:
        assert tokens == num_seqs * queries_per_seq
    else:
        assert cu_seqlens.shape == (num_seqs + 1,)
    if step_states is not None:
        assert step_states.shape[0] == num_seqs and step_states.shape[2:] == (heads, dk, dv)
        assert step_states.dtype == torch.float32 and step_states.stride(4) == 1
    out = torch.empty(tokens, heads, dv, dtype=torch.float32, device=v.device)
    if num_seqs == 0:
        return out
    steps = state if step_states is None else step_states  # never written without step states
    steps_strides = (0, 0, 0, 0) if step_states is None else (*step_states.stride()[:4],)
    block_v = min(_BLOCK_V, triton.next_power_of_2(dv))
    _gated_delta_kernel[(num_seqs, heads, triton.cdiv(dv, block_v))](
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state,
        slots,
        slots if cu_seqlens is None else cu_seqlens,
        steps,
        out,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        state.stride(0),
        state.stride(1),
        state.stride(2),
        *steps_strides,
        out.stride(0),
        out.stride(1),
        0 if step_states is None else step_states.size(1),
        dk**-0.5,
        GROUP=heads // key_heads,
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=block_v,
        QUERIES=queries_per_seq if cu_seqlens is None else 0,
        VARLEN=cu_seqlens is not None,
        STEPS=step_states is not None,
        WRITE_STATE=write_state,
        num_warps=_NUM_WARPS,
        **pdl_launch(v.device),
    )
    return out
