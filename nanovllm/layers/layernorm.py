"""RMSNorm, optionally fused with the residual add that precedes it."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, computed in fp32."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise `x`; with `residual`, first add it and also return the sum."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
