"""A norm, or a gated activation, fused into the projection that follows it where a kernel does both.

For a single row on CUDA (a one-sequence decode step) each pairing is one Triton
GEMV launch: "residual add + RMSNorm + projection" and "SiLU(gate) * up + down
projection". Elsewhere, and for a norm or an activation without such a kernel,
each part runs as its own layer (the add and the RMSNorm still as one
torch.compile kernel on CUDA).

A block builds these once from its own parts; they are plain objects, not
modules, so the norm and the projection stay registered (and named for the
checkpoint) where they belong.
"""

from collections.abc import Callable

import torch
from torch import nn

from nanovllm.layers.activation import gelu_tanh_and_mul, silu_and_mul
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import ColumnParallelLinear, RowParallelLinear, uses_gemv

# hidden_act -> act(gate) * up over gate_up = gate | up
GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": silu_and_mul,
    "gelu_pytorch_tanh": gelu_tanh_and_mul,
}


class NormedProjection:
    """proj(norm(x + residual)), and x + residual, the next residual (x itself when there is none yet)."""

    def __init__(self, norm: nn.Module, proj: ColumnParallelLinear):
        self.norm, self.proj = norm, proj
        self.rms_norm = isinstance(norm, RMSNorm)  # the fused kernels compute an RMSNorm

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # x, residual: [tokens, in] -> [tokens, out], [tokens, in]
        norm, proj = self.norm, self.proj
        if not self.rms_norm:
            residual = x if residual is None else x + residual
            return proj(norm(residual)), residual
        if uses_gemv(x):
            from nanovllm.kernels.triton_gemv import rms_norm_gemv  # Triton is needed on CUDA only

            return rms_norm_gemv(x, residual, norm.weight, norm.eps, proj.weight, proj.bias)
        if residual is None:
            return proj(norm(x)), x
        x, residual = norm(x, residual)
        return proj(x), residual


class GatedProjection:
    """proj(act(gate) * up) for gate_up = gate | up, act being `hidden_act`."""

    def __init__(self, hidden_act: str, proj: RowParallelLinear):
        self.proj = proj
        self.act_and_mul = GATED_ACTIVATIONS[hidden_act]
        self.silu = hidden_act == "silu"  # the fused kernel computes SiLU

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        # gate_up: [tokens, 2 * in] -> [tokens, out]
        proj = self.proj
        if self.silu and uses_gemv(gate_up):
            from nanovllm.kernels.triton_gemv import silu_mul_gemv  # Triton is needed on CUDA only

            return proj.all_reduce(silu_mul_gemv(gate_up, proj.weight, proj.rank_bias()))
        return proj(self.act_and_mul(gate_up))
