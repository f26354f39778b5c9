"""Pearson's chi-square goodness-of-fit test for sampled token frequencies."""

import torch


def chi_square_p_value(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of `samples` (token ids) having been drawn from `probs` [vocab].

    Tokens of zero probability must never appear (checked by the caller); they
    are left out of the statistic along with the degrees of freedom they hold.
    """
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    support = probs > 0
    expected = probs.double()[support] * samples.numel()
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    # the chi-square survival function is the upper regularised incomplete gamma
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))
