"""Gated activations of the MLP: act(gate) * up over gate_up = gate | up; and the sigmoid output gate of
gated attention."""

import functools

import torch
import torch.nn.functional as F

from nanovllm.layers.fusion import fused_on_cuda

# hidden_act -> act; "gelu_pytorch_tanh" is GELU's tanh approximation (GeGLU)
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh")}


def gated_activation(gate_up: torch.Tensor, hidden_act: str) -> torch.Tensor:
    """act(gate) * up, act being `hidden_act`: one Triton kernel on CUDA, PyTorch (the reference) elsewhere."""
    # gate_up: [tokens, 2 * intermediate] -> [tokens, intermediate]
    if gate_up.is_cuda:
        from nanovllm.kernels import triton_gated_activation  # Triton is needed on CUDA only

        return triton_gated_activation.gated_activation(gate_up, hidden_act)
    gate, up = gate_up.chunk(2, dim=-1)
    return ACTIVATIONS[hidden_act](gate) * up


@fused_on_cuda
def sigmoid_gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) in their dtype (one generated kernel on CUDA rather than two launches)."""
    # x, gate: [tokens, heads, head_dim] -> [tokens, heads, head_dim]
    return x * gate.sigmoid()
