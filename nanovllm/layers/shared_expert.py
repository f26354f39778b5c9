"""The shared expert of a mixture-of-experts layer (Qwen3.5-MoE): a gated MLP every token runs through beside
its routed experts, its output scaled per token by sigmoid(gate(y)), gate being a Linear hidden -> 1.

Tensor parallelism splits it as a dense MLP: each rank holds a slice of its width (gate and up by rows, down
by columns) and the replicated gate. It gives this rank's partial output unsummed: the sigmoid scales each
token alike on every rank, so the sum over ranks of the scaled partials is the scaled sum, and the one
all-reduce of the routed experts (`FusedMoE`) sums both.
"""

import torch
from torch import nn

from nanovllm.layers.activation import gated_activation
from nanovllm.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear


class SharedExpert(nn.Module):
    """sigmoid(gate(y)) * down(act(gate_proj(y)) * up_proj(y)), gate_proj | up_proj being one projection;
    this rank's part of the sum over ranks."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str):
        super().__init__()
        self.hidden_act = hidden_act
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size)
        self.gate = ReplicatedLinear(hidden_size, 1)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """This rank's partial output for the normalised hidden states y, not yet summed over the ranks."""
        # y: [tokens, hidden] -> [tokens, hidden]
        activated = gated_activation(self.gate_up_proj(y), self.hidden_act)  # [tokens, width / ranks]
        partial = self.down_proj.project(activated, self.down_proj.rank_bias())
        return partial * self.gate(y).sigmoid()  # gate: [tokens, 1]
