"""A norm, or a gated activation, fused into the projection next to it where a kernel does both.

On CUDA the Triton GEMV (`kernels/triton_gemv.py`) reads "residual add +
RMSNorm" in front of a block's first projection, for one row (a one-sequence
decode step) and for 2 to 16 rows of at most ROWS_FUSION_MAX_INPUTS values (a
decode step of a few sequences, a speculative verify step, of a small
model). It places an MLP's gated activation, SiLU or GeGLU, by rows: for one
row inside the down projection, which then reads act(gate) * up in front; for
several, in the gate/up projection's epilogue, which then writes act(gate) *
up, so that norm, gate/up product and activation are one launch and the down
projection a plain one. Full-precision or FP8 weights alike. Elsewhere, and
for a norm without such a kernel, each part runs as its own layer (the add
and the RMSNorm still as one torch.compile kernel on CUDA).

A block builds these once from its own parts; they are plain objects, not
modules, so the norm and the projections stay registered (and named for the
checkpoint) where they belong.
"""

import torch
from torch import nn

from nanovllm.layers.activation import ACTIVATIONS, gated_activation
from nanovllm.layers.all_reduce import all_reduce, summed_in_gemv
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import ColumnParallelLinear, RowParallelLinear, one_row_on_cuda, uses_gemv

# the most inputs of a product of several rows that reads the norm in front itself: at Qwen3-0.6B's 1024 the
# launches it saves make a verify step faster; at Qwen3-8B's 4096 the longer prologue outweighs them
ROWS_FUSION_MAX_INPUTS = 2048


def norm_in_gemv(x: torch.Tensor, hidden_act: str | None = None) -> bool:
    """Whether the GEMV reads the RMSNorm in front of a product of x (with `hidden_act`, also writing the
    gated activation behind it): one row without an activation (one row reads it in the down projection),
    or a few rows of at most ROWS_FUSION_MAX_INPUTS values."""
    if not uses_gemv(x):
        return False
    return hidden_act is None if x.size(0) == 1 else x.size(1) <= ROWS_FUSION_MAX_INPUTS


class NormedProjection:
    """proj(norm(x + residual)), and x + residual, the next residual (x itself when there is none yet). With
    `partial_input`, an x that comes with a residual is this rank's part of a sum over the tensor-parallel
    ranks (the projection before it left the sum to this norm), summed first; the first layer's x, the
    embedding, comes without one and whole."""

    def __init__(self, norm: nn.Module, proj: ColumnParallelLinear, partial_input: bool = False):
        self.norm, self.proj = norm, proj
        self.rms_norm = isinstance(norm, RMSNorm)  # the fused kernels compute an RMSNorm
        self.partial_input = partial_input

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None, hidden_act: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """With `hidden_act`, proj being gate | up: act(gate) * up of the projection."""
        # x, residual: [tokens, in] -> [tokens, out] (out / 2 with hidden_act), [tokens, in]
        norm, proj = self.norm, self.proj
        reduce = self.partial_input and residual is not None and not summed_in_gemv(x)
        in_gemv = self.rms_norm and norm_in_gemv(x, hidden_act)
        if reduce and (in_gemv or not self.rms_norm):
            # only the RMSNorm of several rows sums x itself (with the add, in one kernel where it can)
            x, reduce = all_reduce(x), False
        if in_gemv:
            from nanovllm.kernels.triton_gemv import rms_norm_gemv  # Triton is needed on CUDA only

            weights = dict(bias=proj.bias, hidden_act=hidden_act, **proj.fp8_weights())
            return rms_norm_gemv(x, residual, norm.weight, norm.eps, proj.weight, **weights)
        if not self.rms_norm:
            residual = x if residual is None else x + residual
            y = proj(norm(residual))
        elif residual is None:
            y, residual = proj(norm(x)), x
        else:
            x, residual = norm(x, residual, reduce=reduce)
            y = proj(x)
        return (y if hidden_act is None else gated_activation(y, hidden_act)), residual


class NormedGatedProjections:
    """down(act(gate) * up) for gate | up = gate_up(norm(x + residual)), act being `hidden_act`, and
    x + residual, the next residual; x a part of a sum with `partial_input` (`NormedProjection`)."""

    def __init__(
        self,
        norm: nn.Module,
        gate_up: ColumnParallelLinear,
        down: RowParallelLinear,
        hidden_act: str,
        partial_input: bool = False,
    ):
        assert hidden_act in ACTIVATIONS  # ModelConfig refuses the others
        self.normed_gate_up = NormedProjection(norm, gate_up, partial_input)
        self.down, self.hidden_act = down, hidden_act

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # x, residual: [tokens, hidden] -> [tokens, hidden], [tokens, hidden]
        down = self.down
        if not one_row_on_cuda(x):
            activated, residual = self.normed_gate_up(x, residual, self.hidden_act)
            return down(activated), residual
        from nanovllm.kernels.triton_gemv import gated_gemv  # Triton is needed on CUDA only

        gate_up, residual = self.normed_gate_up(x, residual)
        weights = dict(ranks_sum=down.ranks_sum_in_gemv(gate_up), **down.fp8_weights())
        activated_down = gated_gemv(gate_up, down.weight, self.hidden_act, down.rank_bias(), **weights)
        return down.all_reduce(activated_down), residual
