"""Gated activation of the MLP."""

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.layers.fusion import fused_on_cuda


@fused_on_cuda
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up; x: [tokens, 2 * intermediate] -> [tokens, intermediate]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    """SiLU(gate) * up, for the fused gate/up projection's output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
