"""A norm, or a gated activation, fused into the projection that follows it where a kernel does both.

For a single row on CUDA (a one-sequence decode step) each pairing is one Triton
GEMV launch: "residual add + RMSNorm + projection" and "SiLU(gate) * up + down
projection" (SiLU or GeGLU), with full-precision or FP8 weights. Elsewhere, and for a
norm without such a kernel, each part runs as its own layer (the add and the RMSNorm still as one
torch.compile kernel on CUDA).

A block builds these once from its own parts; they are plain objects, not
modules, so the norm and the projection stay registered (and named for the
checkpoint) where they belong.
"""

import torch
from torch import nn

from nanovllm.layers.activation import ACTIVATIONS, gated_activation
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import ColumnParallelLinear, RowParallelLinear, one_row_on_cuda


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
        if one_row_on_cuda(x):
            from nanovllm.kernels.triton_gemv import rms_norm_gemv  # Triton is needed on CUDA only

            return rms_norm_gemv(x, residual, norm.weight, norm.eps, proj.weight, proj.bias, **proj.fp8_weights())
        if residual is None:
            return proj(norm(x)), x
        x, residual = norm(x, residual)
        return proj(x), residual


class GatedProjection:
    """proj(act(gate) * up) for gate_up = gate | up, act being `hidden_act`."""

    def __init__(self, hidden_act: str, proj: RowParallelLinear):
        assert hidden_act in ACTIVATIONS  # ModelConfig refuses the others
        self.proj, self.hidden_act = proj, hidden_act

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        # gate_up: [tokens, 2 * in] -> [tokens, out]
        proj = self.proj
        if one_row_on_cuda(gate_up):
            from nanovllm.kernels.triton_gemv import gated_gemv  # Triton is needed on CUDA only

            down = gated_gemv(gate_up, proj.weight, self.hidden_act, proj.rank_bias(), **proj.fp8_weights())
            return proj.all_reduce(down)
        return proj(gated_activation(gate_up, self.hidden_act))
