"""Repetition, frequency and presence penalties on a batch of logits, one set of values per row."""

from dataclasses import dataclass

import torch


@dataclass
class PenaltyTensors:
    """Per-row penalties and the tokens they look at.

    Token lists are padded with the vocabulary size, an id no logit has.
    """

    repetition: torch.Tensor  # [num_seqs] float32; 1 = off
    frequency: torch.Tensor  # [num_seqs] float32; 0 = off
    presence: torch.Tensor  # [num_seqs] float32; 0 = off
    prompt_ids: torch.Tensor  # [num_seqs, max_prompt_len] int64
    output_ids: torch.Tensor  # [num_seqs, max_output_len] int64


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each vocabulary id occurs in each row; padding is not counted."""
    # token_ids: [rows, len] -> counts: [rows, vocab]
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, penalties: PenaltyTensors) -> torch.Tensor:
    """Penalised copy of logits [num_seqs, vocab] (float32), as vLLM and OpenAI define them.

    Repetition: a token seen in the prompt or the output has a positive logit
    divided by the penalty and a negative one multiplied by it. Frequency and
    presence look at the output only: subtract frequency x count, and presence
    once if the count is above zero.
    """
    vocab_size = logits.shape[1]
    output_counts = token_counts(penalties.output_ids, vocab_size)
    seen = (output_counts > 0) | (token_counts(penalties.prompt_ids, vocab_size) > 0)
    repetition = penalties.repetition.unsqueeze(1)
    logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    return (
        logits
        - penalties.frequency.unsqueeze(1) * output_counts
        - penalties.presence.unsqueeze(1) * (output_counts > 0)
    )
