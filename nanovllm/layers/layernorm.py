"""RMSNorm, optionally fused with the residual add that precedes it, and with the tensor-parallel sum before
that."""

import torch
from torch import nn

from nanovllm.layers.all_reduce import all_reduce, all_reduce_add_rms_norm, summed_in_gemv
from nanovllm.layers.fusion import fused_on_cuda


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) over the last dimension, computed in fp32 and returned in x's dtype: a norm
    with no weight (Gemma 4's on each value head)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension, computed in fp32."""
    return weight * rms_normalize(x, eps)


_rms_norm = fused_on_cuda(rms_norm)


@fused_on_cuda
def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    x = x + residual
    return rms_norm(x, weight, eps), x


def _load_plus_one(param: nn.Parameter, loaded) -> None:
    """Load a checkpoint weight w as the scale 1 + w (computed in fp32)."""
    param.data.copy_(loaded[:].float() + 1.0)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, computed in fp32.

    With `unit_offset` (Gemma) the checkpoint's weight w scales by 1 + w: the
    weight is loaded as 1 + w, so that this norm is computed like every other,
    by the same kernels, the fused norm-and-projection ones among them.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, unit_offset: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        if unit_offset:
            self.weight.weight_loader = _load_plus_one

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, reduce: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise `x`; with `residual`, first add it and also return the sum. With `reduce`, `x` is this
        rank's part of a sum over the tensor-parallel ranks, summed first (with a residual, in one kernel
        with the add and the norm where the GPUs map each other's memory)."""
        if reduce and not summed_in_gemv(x):
            fused = None if residual is None else all_reduce_add_rms_norm(x, residual, self.weight, self.eps)
            if fused is not None:
                return fused
            x = all_reduce(x)
        if residual is None:
            return _rms_norm(x, self.weight, self.eps)
        return _add_rms_norm(x, residual, self.weight, self.eps)
