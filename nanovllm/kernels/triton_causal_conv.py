"""Triton kernels: Gated DeltaNet's causal depthwise convolution, each sequence continuing from the last K - 1
inputs in its slot of a state cache, which the kernels update in place.

out[t, c] = act(sum_j weight[c, j] * input[t - K + 1 + j, c]), the inputs before a sequence's first new token
being its state [C, K - 1] (oldest first); act is SiLU or nothing. Products are summed in fp32 and rounded to
x's dtype once. `torch_causal_conv.py` is the reference.

- `conv_varlen` (prefill, sequences packed one after another) runs two kernels. The first computes the
  outputs, grid (token blocks, channel blocks): a program finds each of its tokens' sequence by a binary
  search of cu_seqlens, and takes the inputs before the sequence's start from its slot. The second, grid
  (sequences, channel blocks), writes each sequence's state after its last token (and the per-position
  states, where asked) once every output has read the old one: a sequence shorter than K - 1 keeps part of
  its old state, and its first tokens may sit in another program than its last.
- `conv_queries` (decode and verify steps: Q queries per sequence, padded rows sharing the scratch slot),
  grid (sequences, channel blocks), one launch of a grid fixed by the shapes, so that a CUDA graph can hold it.

A program that overwrites a slot first reads all it needs of it, then waits at a barrier: the threads that
store state column i are not those that read it as column i + 1.
"""

import torch
import triton
import triton.language as tl

_BLOCK_T, _BLOCK_C = 64, 128  # the outputs' tile: rows of contiguous channels
_STATE_BLOCK_C = 256  # channels of a program that writes states


@triton.jit
def _activated(acc, SILU: tl.constexpr):
    """acc, or SiLU(acc), in fp32."""
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    return acc


@triton.jit
def _inputs(x_ptr, stride_x, state_ptr, stride_sc, stride_sk, channels, mask_c, rel, valid, HISTORY: tl.constexpr):
    """The inputs [channels, N] of one sequence at relative positions `rel` [N]: row rel of x (from x_ptr, rows
    stride_x apart) where rel >= 0, else column HISTORY + rel of the state (from state_ptr); in x's dtype."""
    from_x = rel >= 0
    in_x = mask_c[:, None] & (valid & from_x)[None, :]
    in_state = mask_c[:, None] & (valid & (rel < 0))[None, :]
    new = tl.load(x_ptr + rel.to(tl.int64)[None, :] * stride_x + channels[:, None], mask=in_x, other=0.0)
    state_columns = tl.where(from_x, 0, HISTORY + rel)
    old = tl.load(
        state_ptr + channels[:, None] * stride_sc + state_columns[None, :] * stride_sk, mask=in_state, other=0.0
    )
    return tl.where(from_x[None, :], new, old.to(new.dtype))


@triton.jit
def _conv_tokens_kernel(
    x_ptr,
    w_ptr,
    state_ptr,
    slots_ptr,
    cu_seqlens_ptr,
    out_ptr,
    num_tokens,
    num_seqs,
    search_steps,
    C,
    stride_x,
    stride_wc,
    stride_wk,
    stride_ss,
    stride_sc,
    stride_sk,
    K: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_t, mask_c = tokens < num_tokens, channels < C
    # each token's sequence: the last whose start is <= the token (cu_seqlens[lo] <= token < cu_seqlens[hi])
    lo = tl.zeros([BLOCK_T], dtype=tl.int32)
    hi = tl.full([BLOCK_T], num_seqs, dtype=tl.int32)
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        right = tl.load(cu_seqlens_ptr + mid) <= tokens
        lo, hi = tl.where(right, mid, lo), tl.where(right, hi, mid)
    offset = tokens - tl.load(cu_seqlens_ptr + lo)  # [BLOCK_T]: the token's place in its sequence
    slot_rows = tl.load(slots_ptr + lo, mask=mask_t & (offset < K - 1), other=0) * stride_ss
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(K):
        rel = offset - (K - 1) + j  # [BLOCK_T]: the input's place in the sequence, < 0 in the state
        from_x = (rel >= 0) & mask_t
        rows = tokens.to(tl.int64) - (K - 1) + j
        value = tl.load(
            x_ptr + rows[:, None] * stride_x + channels[None, :], mask=from_x[:, None] & mask_c[None, :], other=0.0
        )
        if j < K - 1:  # the token itself is never in the state
            from_state = (rel < 0) & mask_t
            old = tl.load(
                state_ptr + slot_rows[:, None] + channels[None, :] * stride_sc + (K - 1 + rel)[:, None] * stride_sk,
                mask=from_state[:, None] & mask_c[None, :],
                other=0.0,
            )
            value = tl.where(from_state[:, None], old.to(value.dtype), value)
        weight = tl.load(w_ptr + channels * stride_wc + j * stride_wk, mask=mask_c, other=0.0)
        acc += weight.to(tl.float32)[None, :] * value.to(tl.float32)
    out = _activated(acc, SILU).to(out_ptr.dtype.element_ty)
    tl.store(
        out_ptr + tokens.to(tl.int64)[:, None] * C + channels[None, :], out, mask=mask_t[:, None] & mask_c[None, :]
    )


@triton.jit
def _store_states_kernel(
    x_ptr,
    state_ptr,
    slots_ptr,
    cu_seqlens_ptr,
    steps_ptr,
    C,
    num_steps,
    stride_x,
    stride_ss,
    stride_sc,
    stride_sk,
    stride_ps,
    stride_pq,
    stride_pc,
    stride_pk,
    K: tl.constexpr,
    HAS_STEPS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    seq = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = channels < C
    columns = tl.arange(0, BLOCK_K)
    valid = columns < K - 1
    start, end = tl.load(cu_seqlens_ptr + seq), tl.load(cu_seqlens_ptr + seq + 1)
    x_seq = x_ptr + start.to(tl.int64) * stride_x
    state = state_ptr + tl.load(slots_ptr + seq) * stride_ss
    length = end - start
    # the state after token e holds the inputs at e + 2 - K ... e
    last = _inputs(
        x_seq, stride_x, state, stride_sc, stride_sk, channels, mask_c, length + 1 - K + columns, valid, K - 1
    )
    store_mask = mask_c[:, None] & valid[None, :]
    if HAS_STEPS:
        steps = steps_ptr + seq.to(tl.int64) * stride_ps + channels[:, None] * stride_pc + columns[None, :] * stride_pk
        for step in range(num_steps):
            rel = tl.minimum(step, length - 1) + 2 - K + columns
            after = _inputs(x_seq, stride_x, state, stride_sc, stride_sk, channels, mask_c, rel, valid, K - 1)
            tl.store(steps + step * stride_pq, after.to(steps_ptr.dtype.element_ty), mask=store_mask)
    tl.debug_barrier()
    state_at = state + channels[:, None] * stride_sc + columns[None, :] * stride_sk
    tl.store(state_at, last.to(state_ptr.dtype.element_ty), mask=store_mask)


def conv_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    step_states: torch.Tensor | None = None,
    silu: bool = True,
) -> torch.Tensor:
    """The (SiLU-activated, where `silu`) convolution of sequences packed one after another (`cu_seqlens`
    delimits them, each at least one token), each from the state in its slot of `conv_state`, where it leaves
    its state after its last token. `step_states`, where given, receives each sequence's state after each of
    its first S tokens (a shorter one's last state past its end), as `causal_conv_varlen` gives them."""
    # x: [tokens, C] (rows may be strided); weight: [C, K]; conv_state: [slots_total, C, K - 1];
    # slots: [seqs] int64; cu_seqlens: [seqs + 1] int32; step_states: [seqs, S, C, K - 1] -> [tokens, C]
    num_tokens, C = x.shape
    K, num_seqs = weight.size(1), slots.numel()
    assert x.stride(1) == 1 and weight.size(0) == C and conv_state.shape[1:] == (C, K - 1)
    assert cu_seqlens.numel() == num_seqs + 1
    out = torch.empty(num_tokens, C, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    ss, sc, sk = conv_state.stride()
    grid = (triton.cdiv(num_tokens, _BLOCK_T), triton.cdiv(C, _BLOCK_C))
    _conv_tokens_kernel[grid](
        x, weight, conv_state, slots, cu_seqlens, out, num_tokens, num_seqs, (num_seqs - 1).bit_length(), C,
        x.stride(0), *weight.stride(), ss, sc, sk,
        K=K, SILU=silu, BLOCK_T=_BLOCK_T, BLOCK_C=_BLOCK_C, num_warps=8,
    )  # fmt: skip
    assert step_states is None or (step_states.size(0) == num_seqs and step_states.shape[2:] == (C, K - 1))
    steps = conv_state if step_states is None else step_states  # any pointer where there are none
    step_strides = (0, 0, 0, 0) if step_states is None else step_states.stride()
    _store_states_kernel[(num_seqs, triton.cdiv(C, _STATE_BLOCK_C))](
        x, conv_state, slots, cu_seqlens, steps, C, 0 if step_states is None else step_states.size(1),
        x.stride(0), ss, sc, sk, *step_strides,
        K=K, HAS_STEPS=step_states is not None, BLOCK_C=_STATE_BLOCK_C, BLOCK_K=triton.next_power_of_2(K - 1),
    )  # fmt: skip
    return out


@triton.jit
def _conv_queries_kernel(
    x_ptr,
    w_ptr,
    state_ptr,
    slots_ptr,
    out_ptr,
    steps_ptr,
    C,
    stride_xs,
    stride_xq,
    stride_wc,
    stride_wk,
    stride_ss,
    stride_sc,
    stride_sk,
    stride_ps,
    stride_pq,
    stride_pc,
    stride_pk,
    K: tl.constexpr,
    Q: tl.constexpr,
    SILU: tl.constexpr,
    HAS_STEPS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    seq = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = channels < C
    taps = tl.arange(0, BLOCK_K)  # the window's inputs; its first K - 1 are a state's columns
    x_seq = x_ptr + seq.to(tl.int64) * stride_xs
    state = state_ptr + tl.load(slots_ptr + seq) * stride_ss
    weight = tl.load(
        w_ptr + channels[:, None] * stride_wc + taps[None, :] * stride_wk,
        mask=mask_c[:, None] & (taps < K)[None, :],
        other=0.0,
    ).to(tl.float32)
    store_mask = mask_c[:, None] & (taps < K - 1)[None, :]
    out_at = out_ptr + seq.to(tl.int64) * Q * C + channels
    for q in tl.static_range(Q):
        # query q's window holds the inputs at q + 1 - K ... q: its state, then the queries up to q
        window = _inputs(
            x_seq, stride_xq, state, stride_sc, stride_sk, channels, mask_c, q + 1 - K + taps, taps < K, K - 1
        )
        out = _activated(tl.sum(window.to(tl.float32) * weight, axis=1), SILU)
        tl.store(out_at + q * C, out.to(out_ptr.dtype.element_ty), mask=mask_c)
        if HAS_STEPS:
            after = _inputs(
                x_seq, stride_xq, state, stride_sc, stride_sk, channels, mask_c, q + 2 - K + taps, taps < K - 1, K - 1
            )
            steps_at = steps_ptr + seq.to(tl.int64) * stride_ps + q * stride_pq
            steps_at += channels[:, None] * stride_pc + taps[None, :] * stride_pk
            tl.store(steps_at, after.to(steps_ptr.dtype.element_ty), mask=store_mask)
    if Q == 1:  # a decode step moves the slot on; a verify step leaves it as it was
        last = _inputs(
            x_seq, stride_xq, state, stride_sc, stride_sk, channels, mask_c, 2 - K + taps, taps < K - 1, K - 1
        )
        tl.debug_barrier()
        state_at = state + channels[:, None] * stride_sc + taps[None, :] * stride_sk
        tl.store(state_at, last.to(state_ptr.dtype.element_ty), mask=store_mask)


def conv_queries(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    step_states: torch.Tensor | None = None,
    silu: bool = True,
) -> torch.Tensor:
    """The (SiLU-activated, where `silu`) convolution of Q queries per sequence (a decode step's token, or a
    verify step's last token and its drafts) from the state in its slot of `conv_state`. With one query the
    slot takes the state after it; with more the slots stay as they were. `step_states`, where given,
    receives the state after each query, as `causal_conv_queries` gives them. No host sync: a CUDA graph can
    hold it."""
    # x: [seqs, Q, C] (rows may be strided); weight: [C, K]; conv_state: [slots_total, C, K - 1];
    # slots: [seqs] int64; step_states: [seqs, Q, C, K - 1] -> [seqs, Q, C]
    num_seqs, Q, C = x.shape
    K = weight.size(1)
    assert x.stride(2) == 1 and weight.size(0) == C and conv_state.shape[1:] == (C, K - 1)
    assert slots.numel() == num_seqs
    assert step_states is None or step_states.shape == (num_seqs, Q, C, K - 1)
    out = torch.empty(num_seqs, Q, C, dtype=x.dtype, device=x.device)
    if num_seqs == 0 or Q == 0:
        return out
    steps = conv_state if step_states is None else step_states  # any pointer where there are none
    step_strides = (0, 0, 0, 0) if step_states is None else step_states.stride()
    _conv_queries_kernel[(num_seqs, triton.cdiv(C, _STATE_BLOCK_C))](
        x, weight, conv_state, slots, out, steps, C, x.stride(0), x.stride(1), *weight.stride(),
        *conv_state.stride(), *step_strides,
        K=K, Q=Q, SILU=silu, HAS_STEPS=step_states is not None, BLOCK_C=_STATE_BLOCK_C,
        BLOCK_K=triton.next_power_of_2(K),
    )  # fmt: skip
    return out
