"""Gated activation of the MLP."""

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """SiLU(gate) * up, for the fused gate/up projection's output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [tokens, 2 * intermediate] -> [tokens, intermediate]
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
