"""Triton kernels: Gated DeltaNet's causal depthwise convolution, each sequence continuing from the last K - 1
inputs in its slot of a state cache, which the kernels update in place.

out[t, c] = act(sum_j weight[c, j] * input[t - K + 1 + j, c]), the inputs before a sequence's first new token
being its state [C, K - 1] (oldest first); act is SiLU or nothing. Products are summed in fp32 (tap 0 first)
and rounded to x's dtype once. `torch_causal_conv.py` is the reference.

The kernels only move memory, so every value they hold is a vector of consecutive channels [BLOCK_C]: a
warp's lanes read and write consecutive addresses of x and out (and, in a state [C, K - 1], addresses
2 (K - 1) bytes apart, which the next columns' accesses fill in). Windows are tuples of such vectors,
unrolled over the taps and over a tile's rows or a program's sequences: in the kernels that carry the
traffic (conv_varlen's first, and conv_queries) each input is read once, all reads are issued before the
first store, and no value changes threads.

- `conv_varlen` (prefill, sequences packed one after another) runs two kernels. The first, grid (token
  blocks, channel blocks), convolves the packed rows as if they were one sequence: a program reads its
  BLOCK_T rows and the K - 1 above them, and writes BLOCK_T outputs. Only the outputs of each sequence's
  first K - 1 tokens come out wrong (their windows reach into the sequence before); the second kernel,
  grid (sequences, channel blocks), overwrites them with the ones from the sequence's state, writes the
  per-position states (where asked), then the state after the sequence's last token.
- `conv_queries` (decode and verify steps: Q queries per sequence, padded rows sharing the scratch slot),
  grid (sequence blocks, channel blocks): a program convolves BLOCK_S sequences, one launch of a grid fixed
  by the shapes, so that a CUDA graph can hold it.

A program that overwrites a slot first reads all it needs of it (a sequence shorter than K - 1 keeps part
of its old state), then waits at a barrier, so that no thread stores over a value another has yet to read.
The second kernel and `conv_queries` give each thread one channel (num_warps = BLOCK_C / 32): x's vectors
then take the states' layout, where several channels a thread would exchange them through shared memory.

The block sizes are module constants, read at each call, so that a benchmark may sweep them.
"""

import torch
import triton
import triton.language as tl

TOKENS_BLOCK_T, TOKENS_BLOCK_C, TOKENS_WARPS = 32, 512, 4  # the output tile of conv_varlen's first kernel
STATES_BLOCK_C = 128  # channels of a program of conv_varlen's second kernel, one a thread
QUERIES_BLOCK_S, QUERIES_BLOCK_C = 8, 128  # most sequences, and channels (one a thread), of a conv_queries program


@triton.jit
def _activated(acc, SILU: tl.constexpr):
    """acc, or SiLU(acc), in fp32."""
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    return acc


@triton.jit
def _weights(w_ptr, stride_wc, stride_wk, channels, mask_c, K: tl.constexpr):
    """The K taps' weights of `channels`, each a vector [BLOCK_C] in fp32."""
    taps = ()
    for j in tl.static_range(K):
        taps = taps + (tl.load(w_ptr + channels * stride_wc + j * stride_wk, mask=mask_c, other=0.0).to(tl.float32),)
    return taps


@triton.jit(do_not_specialize=["num_tokens"])  # one compile for every count
def _conv_tokens_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    num_tokens,
    C,
    stride_x,
    stride_wc,
    stride_wk,
    K: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    first = tl.program_id(0) * BLOCK_T
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = channels < C
    weights = _weights(w_ptr, stride_wc, stride_wk, channels, mask_c, K)
    # the rows [BLOCK_T + K - 1] x [BLOCK_C] of the tile's windows, each read once, all before any store
    rows = ()
    for r in tl.static_range(BLOCK_T + K - 1):
        token = first + r + 1 - K
        readable = mask_c & (token >= 0) & (token < num_tokens)
        rows = rows + (tl.load(x_ptr + token.to(tl.int64) * stride_x + channels, mask=readable, other=0.0),)
    for r in tl.static_range(BLOCK_T):
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(K):
            acc += weights[j] * rows[r + j].to(tl.float32)
        token = first + r
        out = _activated(acc, SILU).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + token.to(tl.int64) * C + channels, out, mask=mask_c & (token < num_tokens))


@triton.jit
def _input(x_seq, stride_x, state, stride_sk, mask_c, rel):
    """One sequence's inputs [BLOCK_C] at relative position `rel` (a scalar): row rel of x (from x_seq, rows
    stride_x apart) where rel >= 0, else column K - 1 + rel of its state (state + rel * stride_sk points at
    it); in x's dtype."""
    new = tl.load(x_seq + rel.to(tl.int64) * stride_x, mask=mask_c & (rel >= 0), other=0.0)
    old = tl.load(state + rel * stride_sk, mask=mask_c & (rel < 0), other=0.0)
    return tl.where(rel >= 0, new, old.to(new.dtype))


@triton.jit(do_not_specialize=["num_steps"])  # one compile for every count
def _conv_states_kernel(
    x_ptr,
    w_ptr,
    state_ptr,
    slots_ptr,
    cu_seqlens_ptr,
    out_ptr,
    steps_ptr,
    C,
    num_steps,
    stride_x,
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
    SILU: tl.constexpr,
    HAS_STEPS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    seq = tl.program_id(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = channels < C
    start, end = tl.load(cu_seqlens_ptr + seq), tl.load(cu_seqlens_ptr + seq + 1)
    length = end - start
    x_seq = x_ptr + start.to(tl.int64) * stride_x + channels
    # the state's column K - 1 + rel holds the input at rel < 0: `state` points at rel = 0, one past the last
    state = state_ptr + tl.load(slots_ptr + seq) * stride_ss + channels * stride_sc + (K - 1) * stride_sk
    old = ()  # [K - 1] x [BLOCK_C]: the inputs at 1 - K ... -1
    for i in tl.static_range(K - 1):
        value = tl.load(state + (i + 1 - K) * stride_sk, mask=mask_c, other=0.0)
        old = old + (value.to(x_ptr.dtype.element_ty),)
    weights = _weights(w_ptr, stride_wc, stride_wk, channels, mask_c, K)
    out_seq = out_ptr + start.to(tl.int64) * C + channels
    for t in tl.static_range(K - 1):  # the first K - 1 tokens, whose windows start in the state
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(K):  # the input at t + 1 - K + j: in the state while t + j < K - 1
            if t + j < K - 1:
                value = old[t + j]
            else:
                value = tl.load(x_seq + (t + 1 - K + j) * stride_x, mask=mask_c & (t < length), other=0.0)
            acc += weights[j] * value.to(tl.float32)
        tl.store(out_seq + t * C, _activated(acc, SILU).to(out_ptr.dtype.element_ty), mask=mask_c & (t < length))
    if HAS_STEPS:
        steps = steps_ptr + seq.to(tl.int64) * stride_ps + channels * stride_pc
        for step in range(num_steps):
            # the state after token e holds the inputs at e + 2 - K ... e
            last = tl.minimum(step, length - 1)
            for i in tl.static_range(K - 1):
                after = _input(x_seq, stride_x, state, stride_sk, mask_c, last + 2 - K + i)
                tl.store(steps + step * stride_pq + i * stride_pk, after.to(steps_ptr.dtype.element_ty), mask=mask_c)
    new = ()  # [K - 1] x [BLOCK_C]: the inputs at length + 1 - K ... length - 1
    for i in tl.static_range(K - 1):
        new = new + (_input(x_seq, stride_x, state, stride_sk, mask_c, length + 1 - K + i),)
    tl.debug_barrier()
    for i in tl.static_range(K - 1):
        tl.store(state + (i + 1 - K) * stride_sk, new[i].to(state_ptr.dtype.element_ty), mask=mask_c)


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
    assert step_states is None or (step_states.size(0) == num_seqs and step_states.shape[2:] == (C, K - 1))
    out = torch.empty(num_tokens, C, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    grid = (triton.cdiv(num_tokens, TOKENS_BLOCK_T), triton.cdiv(C, TOKENS_BLOCK_C))
    _conv_tokens_kernel[grid](
        x, weight, out, num_tokens, C, x.stride(0), *weight.stride(),
        K=K, SILU=silu, BLOCK_T=TOKENS_BLOCK_T, BLOCK_C=TOKENS_BLOCK_C, num_warps=TOKENS_WARPS,
    )  # fmt: skip
    steps = conv_state if step_states is None else step_states  # any pointer where there are none
    step_strides = (0, 0, 0, 0) if step_states is None else step_states.stride()
    _conv_states_kernel[(num_seqs, triton.cdiv(C, STATES_BLOCK_C))](
        x, weight, conv_state, slots, cu_seqlens, out, steps, C, 0 if step_states is None else step_states.size(1),
        x.stride(0), *weight.stride(), *conv_state.stride(), *step_strides,
        K=K, SILU=silu, HAS_STEPS=step_states is not None, BLOCK_C=STATES_BLOCK_C, num_warps=STATES_BLOCK_C // 32,
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["num_seqs"])  # one compile for every count
def _conv_queries_kernel(
    x_ptr,
    w_ptr,
    state_ptr,
    slots_ptr,
    out_ptr,
    steps_ptr,
    num_seqs,
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
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    first = tl.program_id(0) * BLOCK_S
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = channels < C
    weights = _weights(w_ptr, stride_wc, stride_wk, channels, mask_c, K)
    # each sequence's window [K - 1 + Q] x [BLOCK_C] in x's dtype, its state's columns then its queries, all
    # read before any store, since a decode step overwrites the states
    states, windows = (), ()
    for s in tl.static_range(BLOCK_S):
        seq = first + s
        mask = mask_c & (seq < num_seqs)
        state = state_ptr + tl.load(slots_ptr + seq, mask=seq < num_seqs, other=0) * stride_ss + channels * stride_sc
        states = states + (state,)
        for i in tl.static_range(K - 1):
            value = tl.load(state + i * stride_sk, mask=mask, other=0.0)
            windows = windows + (value.to(x_ptr.dtype.element_ty),)
        x_seq = x_ptr + seq.to(tl.int64) * stride_xs + channels
        for q in tl.static_range(Q):
            windows = windows + (tl.load(x_seq + q * stride_xq, mask=mask, other=0.0),)
    for s in tl.static_range(BLOCK_S):
        seq = first + s
        mask = mask_c & (seq < num_seqs)
        out_seq = out_ptr + seq.to(tl.int64) * Q * C + channels
        steps = steps_ptr + seq.to(tl.int64) * stride_ps + channels * stride_pc
        for q in tl.static_range(Q):
            acc = tl.zeros([BLOCK_C], dtype=tl.float32)
            for j in tl.static_range(K):  # query q's window holds the inputs at q + 1 - K ... q
                acc += weights[j] * windows[s * (K - 1 + Q) + q + j].to(tl.float32)
            tl.store(out_seq + q * C, _activated(acc, SILU).to(out_ptr.dtype.element_ty), mask=mask)
            if HAS_STEPS:
                for i in tl.static_range(K - 1):
                    after = windows[s * (K - 1 + Q) + q + 1 + i].to(steps_ptr.dtype.element_ty)
                    tl.store(steps + q * stride_pq + i * stride_pk, after, mask=mask)
    if Q == 1:  # a decode step moves the slots on; a verify step leaves them as they were
        tl.debug_barrier()
        for s in tl.static_range(BLOCK_S):
            mask = mask_c & (first + s < num_seqs)
            for i in tl.static_range(K - 1):
                after = windows[s * K + i + 1].to(state_ptr.dtype.element_ty)
                tl.store(states[s] + i * stride_sk, after, mask=mask)


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
    block_s = min(QUERIES_BLOCK_S, triton.next_power_of_2(num_seqs))  # no idle rows for a small batch
    _conv_queries_kernel[(triton.cdiv(num_seqs, block_s), triton.cdiv(C, QUERIES_BLOCK_C))](
        x, weight, conv_state, slots, out, steps, num_seqs, C, x.stride(0), x.stride(1), *weight.stride(),
        *conv_state.stride(), *step_strides,
        K=K, Q=Q, SILU=silu, HAS_STEPS=step_states is not None, BLOCK_S=block_s, BLOCK_C=QUERIES_BLOCK_C,
        num_warps=QUERIES_BLOCK_C // 32,
    )  # fmt: skip
    return out
