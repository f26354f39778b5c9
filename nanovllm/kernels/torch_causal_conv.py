"""A causal depthwise convolution over each sequence, continuing from its last inputs, in plain PyTorch (CPU
path, reference).

Channel c of token t is sum_j weight[c, j] * x[t - K + 1 + j, c] over the K - 1 inputs before t and t
itself; the inputs before a sequence's first new token are its state [channels, K - 1] (the last K - 1
inputs the sequence had, zeros for a new one), and the state after a step is the last K - 1 inputs again.
"""

import torch


def causal_conv_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    step_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution of sequences packed one after another (`cu_seqlens` delimits them, each at least one
    token), each from its state, and each one's state after its last token. `step_states`, where given,
    receives each sequence's state after each of its first S tokens (a shorter one's last state past its end:
    speculative decoding keeps the one after a request's last kept draft)."""
    # x: [tokens, C]; weight: [C, K]; states: [seqs, C, K - 1]; cu_seqlens: [seqs + 1];
    # step_states: [seqs, S, C, K - 1] -> [tokens, C], [seqs, C, K - 1]
    tokens, seqs, history = x.size(0), states.size(0), weight.size(1) - 1
    steps = torch.arange(weight.size(1), device=x.device)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    seq_of_token = torch.repeat_interleave(torch.arange(seqs, device=x.device), lengths, output_size=tokens)
    # each sequence's state, then its tokens, one after another: token i's inputs end at its row
    token_rows = torch.arange(tokens, device=x.device) + (seq_of_token + 1) * history
    ends = cu_seqlens[1:] + (torch.arange(seqs, device=x.device) + 1) * history  # [seqs]: past each one's last row
    state_rows = (ends - lengths - history)[:, None] + steps[:history]  # [seqs, K - 1]
    inputs = x.new_empty(tokens + seqs * history, x.size(1))
    inputs[token_rows] = x
    inputs[state_rows] = states.transpose(1, 2).to(x.dtype)
    windows = inputs[token_rows[:, None] - history + steps]  # [tokens, K, C]
    out = torch.einsum("tkc,ck->tc", windows, weight)
    last_rows = ends[:, None] - history + steps[:history]  # [seqs, K - 1]
    if step_states is not None:
        first = cu_seqlens[:-1, None] + torch.arange(step_states.size(1), device=x.device)  # [seqs, S]
        recorded = token_rows[torch.minimum(first, cu_seqlens[1:, None] - 1)]  # [seqs, S]: each token's row
        rows = recorded[:, :, None] - history + 1 + steps[:history]  # [seqs, S, K - 1]
        step_states.copy_(inputs[rows].transpose(2, 3))
    return out, inputs[last_rows].transpose(1, 2)


def causal_conv_queries(
    x: torch.Tensor, weight: torch.Tensor, states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The convolution of Q new tokens per sequence (one in a decode step; a verify step's last token and its
    drafts) from each one's state, and the state after each of them."""
    # x: [seqs, Q, C]; weight: [C, K]; states: [seqs, C, K - 1] -> [seqs, Q, C], [seqs, Q, C, K - 1]
    inputs = torch.cat((states.to(x.dtype), x.transpose(1, 2)), dim=2)  # [seqs, C, K - 1 + Q]
    windows = inputs.unfold(2, weight.size(1), 1)  # [seqs, C, Q, K]: query j's inputs end at column K - 1 + j
    out = torch.einsum("scqk,ck->sqc", windows, weight)
    return out, windows[..., 1:].transpose(1, 2)
