"""Token sampling: temperature, softmax and Gumbel-max in one batched pass."""

import torch
from torch import nn


class Sampler(nn.Module):
    """Picks one token per row of logits; rows with temperature 0 take the argmax.

    Sampling divides the probabilities by Exp(1) noise and takes the argmax,
    which draws from softmax(logits / T) without a multinomial.
    """

    def forward(self, logits: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [num_seqs] for logits [num_seqs, vocab]; no temperatures means all greedy."""
        greedy = logits.argmax(dim=-1)
        if temperatures is None:
            return greedy
        logits = logits.float()
        is_greedy = temperatures == 0
        scaled = logits / torch.where(is_greedy, 1.0, temperatures).unsqueeze(1)
        probs = torch.softmax(scaled, dim=-1)
        noise = torch.empty_like(probs).exponential_(1).clamp_min_(1e-10)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(is_greedy, greedy, sampled)
