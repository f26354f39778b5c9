"""The causal depthwise convolution's PyTorch reference: packed sequences from their states against
F.conv1d over each sequence with its history in front, the states it leaves, and one decode step."""

import torch
import torch.nn.functional as F

from nanovllm.kernels.torch_causal_conv import causal_conv_queries, causal_conv_varlen

CHANNELS, KERNEL = 6, 4


def conv_of_one(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """F.conv1d over one sequence's tokens x [tokens, C] with its state [C, K - 1] in front: [tokens, C]."""
    inputs = torch.cat((state, x.T), dim=1)[None]  # [1, C, K - 1 + tokens]
    return F.conv1d(inputs, weight[:, None], groups=CHANNELS)[0].T


def test_packed_sequences_continue_from_their_states_and_leave_their_last_inputs():
    torch.manual_seed(0)
    lengths = [5, 1, 2, 9]  # shorter and longer than the kernel's history of 3
    weight = torch.randn(CHANNELS, KERNEL)
    states = torch.randn(len(lengths), CHANNELS, KERNEL - 1)
    x = torch.randn(sum(lengths), CHANNELS)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out, new_states = causal_conv_varlen(x, weight, states, cu_seqlens)
    for i, seq in enumerate(x.split(lengths)):
        start, end = cu_seqlens[i], cu_seqlens[i + 1]
        torch.testing.assert_close(out[start:end], conv_of_one(seq, weight, states[i]), atol=1e-5, rtol=1e-5)
        history = torch.cat((states[i], seq.T), dim=1)[:, -(KERNEL - 1) :]
        torch.testing.assert_close(new_states[i], history, atol=0, rtol=0)


def test_a_decode_step_equals_packed_sequences_of_one_token():
    torch.manual_seed(1)
    weight = torch.randn(CHANNELS, KERNEL)
    states, x = torch.randn(3, CHANNELS, KERNEL - 1), torch.randn(3, CHANNELS)
    out, per_query = causal_conv_queries(x[:, None], weight, states)  # one query per sequence
    out, new_states = out[:, 0], per_query[:, -1]
    packed_out, packed_states = causal_conv_varlen(x, weight, states, torch.arange(4, dtype=torch.int32))
    torch.testing.assert_close(out, packed_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(new_states, packed_states, atol=0, rtol=0)
