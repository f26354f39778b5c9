"""RMSNorm, optionally fused with the residual add that precedes it."""

import torch
from torch import nn

from nanovllm.layers.fusion import fused_on_cuda


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension, computed in fp32; with `unit_offset`
    (Gemma) the scale is 1 + weight, applied in fp32 before the cast back, as Gemma's checkpoints expect."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if unit_offset:
        return (x32 * (1.0 + weight.float())).to(x.dtype)
    return weight * x32.to(x.dtype)


_rms_norm = fused_on_cuda(rms_norm)


@fused_on_cuda
def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    x = x + residual
    return rms_norm(x, weight, eps, unit_offset), x


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, computed in fp32; `unit_offset`: the
    checkpoint's weight w scales by 1 + w (Gemma)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, unit_offset: bool = False):
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise `x`; with `residual`, first add it and also return the sum."""
        if residual is None:
            return _rms_norm(x, self.weight, self.eps, self.unit_offset)
        return _add_rms_norm(x, residual, self.weight, self.eps, self.unit_offset)
