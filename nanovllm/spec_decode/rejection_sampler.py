"""Rejection sampling of drafted tokens: the emitted tokens follow the target's distribution exactly,
whatever the draft's.

At each drafted position j, draft token x drawn from the draft's q_j is kept with
probability min(1, p_j(x) / q_j(x)); at the first position it is not, the
token is drawn instead from the residual max(p_j - q_j, 0), renormalised, and
the run ends there. When every draft is kept, a bonus token is drawn from the
target's distribution after the last. Each emitted token is then distributed as
the target's p at its position (Leviathan et al., 2023). A point-mass draft
(the n-gram method's) reduces to: draw from p and keep the draft while the draw
equals it (`verification.py` does that with the request's own sampler).
"""

import torch


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of non-negative `weights` [..., vocab], in proportion to them (Gumbel-max: the
    argmax of the weights over Exp(1) noise), without normalising them first."""
    noise = torch.empty_like(weights).exponential_(1, generator=generator)
    return (weights / noise).argmax(dim=-1)


def rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens each request emits and how many.

    target_probs: [batch, k + 1, vocab], the target's distributions at the k
    drafted positions and the bonus position after them; draft_probs: [batch,
    k, vocab], the distributions the drafts were drawn from; draft_token_ids:
    [batch, k]. Returns token ids [batch, k + 1] (the kept drafts, then the
    residual's or the bonus token; -1 past a request's run) and the number of
    tokens each request emits [batch], from 1 to k + 1.
    """
    batch, k = draft_token_ids.shape
    positions = torch.arange(k + 1, device=draft_token_ids.device)
    drafted = draft_token_ids.unsqueeze(-1)
    p = target_probs[:, :k].gather(2, drafted).squeeze(-1)  # [batch, k]
    q = draft_probs.gather(2, drafted).squeeze(-1)  # [batch, k]
    uniform = torch.rand(batch, k, device=p.device, generator=generator)
    # u < p / q without the division; a draft is drawn from q, so q > 0 where it matters
    kept = uniform * q < p
    num_kept = kept.long().cumprod(dim=1).sum(dim=1)  # [batch]
    residual = (target_probs[:, :k] - draft_probs).clamp_min(0)  # [batch, k, vocab]
    # p == q leaves no residual, and then every draft is kept: draw from p there, which is never used
    empty = residual.sum(dim=-1, keepdim=True) == 0
    residual = torch.where(empty, target_probs[:, :k], residual)
    replacements = torch.cat([_draw(residual, generator), _draw(target_probs[:, k], generator).unsqueeze(1)], dim=1)
    drafts = torch.cat([draft_token_ids, torch.full_like(draft_token_ids[:, :1], -1)], dim=1)  # [batch, k + 1]
    ends = num_kept.unsqueeze(1)
    token_ids = torch.where(positions < ends, drafts, torch.where(positions == ends, replacements, -1))
    return token_ids, num_kept + 1
