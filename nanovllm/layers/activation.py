"""Gated activations of the MLP: act(gate) * up over gate_up = gate | up; and the sigmoid output gate of
gated attention."""

import functools

import torch
import torch.nn.functional as F

from nanovllm.layers.fusion import fused_on_cuda

# hidden_act -> act; "gelu_pytorch_tanh" is GELU's tanh approximation (GeGLU)
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh")}
# gpt-oss's experts: gate clamped at 7 and up to [-7, 7], then (up + 1) * gate * sigmoid(1.702 * gate); the
# limit and alpha of its published models, which transformers' class fixes too
GPT_OSS_SWIGLU = "gpt_oss_swiglu"
_GPT_OSS_LIMIT, _GPT_OSS_ALPHA = 7.0, 1.702


def gated_activation(gate_up: torch.Tensor, hidden_act: str) -> torch.Tensor:
    """act(gate) * up, act being `hidden_act` (or gpt-oss's clamped SwiGLU, `GPT_OSS_SWIGLU`): one Triton kernel
    on CUDA, PyTorch (the reference) elsewhere."""
    # gate_up: [tokens, 2 * intermediate] -> [tokens, intermediate]
    if gate_up.is_cuda:
        from nanovllm.kernels import triton_gated_activation  # Triton is needed on CUDA only

        return triton_gated_activation.gated_activation(gate_up, hidden_act)
    gate, up = gate_up.chunk(2, dim=-1)
    if hidden_act == GPT_OSS_SWIGLU:
        gate, up = gate.clamp(max=_GPT_OSS_LIMIT), up.clamp(-_GPT_OSS_LIMIT, _GPT_OSS_LIMIT)
        return (up + 1) * gate * torch.sigmoid(gate * _GPT_OSS_ALPHA)
    return ACTIVATIONS[hidden_act](gate) * up


@fused_on_cuda
def sigmoid_gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) in their dtype (one generated kernel on CUDA rather than two launches)."""
    # x, gate: [tokens, heads, head_dim] -> [tokens, heads, head_dim]
    return x * gate.sigmoid()
