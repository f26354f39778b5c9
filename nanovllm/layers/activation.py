"""Gated activations of the MLP."""

import torch
import torch.nn.functional as F

from nanovllm.layers.fusion import fused_on_cuda


@fused_on_cuda
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up; x: [tokens, 2 * intermediate] -> [tokens, intermediate]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@fused_on_cuda
def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GELU(gate) * up with GELU's tanh approximation (GeGLU, `gelu_pytorch_tanh`);
    x: [tokens, 2 * intermediate] -> [tokens, intermediate]."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
