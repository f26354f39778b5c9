"""Rejection sampling: whatever the draft's distribution, each emitted token follows the target's
(chi-square on a tiny vocabulary), and a draft equal to the target is always kept."""

import pytest
import torch

from nanovllm.spec_decode.rejection_sampler import rejection_sample

from helpers.chi_square import chi_square_p_value

VOCAB = 6
SAMPLES = 40_000


def drafts_from(draft_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draft tokens [SAMPLES, k] drawn from each position's distribution [k, vocab]."""
    return torch.stack([torch.multinomial(q, SAMPLES, replacement=True, generator=generator) for q in draft_probs], 1)


def target_and_draft(closeness: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A target [3, vocab] (two drafted positions and the bonus one) and a draft [2, vocab] that is
    `closeness` of the way from an unrelated distribution to the target."""
    generator = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(3, VOCAB, generator=generator) * 1.5, dim=-1)
    unrelated = torch.softmax(torch.randn(2, VOCAB, generator=generator) * 3, dim=-1)
    return target, closeness * target[:2] + (1 - closeness) * unrelated


@pytest.mark.parametrize("closeness", [0.9, 0.0])
def test_emitted_tokens_follow_the_target_at_every_position(closeness):
    target, draft = target_and_draft(closeness)
    generator = torch.Generator().manual_seed(1)
    drafts = drafts_from(draft, generator)
    token_ids, num_emitted = rejection_sample(
        target.expand(SAMPLES, -1, -1), draft.expand(SAMPLES, -1, -1), drafts, generator
    )
    assert ((num_emitted >= 1) & (num_emitted <= 3)).all()
    positions = torch.arange(3)
    assert ((token_ids >= 0) == (positions < num_emitted.unsqueeze(1))).all()
    # the target here ignores the context, so every position's emitted tokens follow that position's target
    for position in range(3):
        emitted = token_ids[num_emitted > position, position]
        assert emitted.numel() > 1000
        assert chi_square_p_value(emitted, target[position]) > 1e-3


def test_a_draft_equal_to_the_target_is_always_kept():
    target, _ = target_and_draft(1.0)
    generator = torch.Generator().manual_seed(2)
    drafts = drafts_from(target[:2], generator)
    token_ids, num_emitted = rejection_sample(
        target.expand(SAMPLES, -1, -1), target[:2].expand(SAMPLES, -1, -1), drafts, generator
    )
    assert (num_emitted == 3).all()
    assert torch.equal(token_ids[:, :2], drafts)


def test_a_point_mass_draft_is_kept_as_often_as_the_target_draws_it():
    target, _ = target_and_draft(1.0)
    generator = torch.Generator().manual_seed(3)
    point = torch.zeros(2, VOCAB)
    point[:, 4] = 1.0
    drafts = torch.full((SAMPLES, 2), 4)
    token_ids, num_emitted = rejection_sample(
        target.expand(SAMPLES, -1, -1), point.expand(SAMPLES, -1, -1), drafts, generator
    )
    kept_first = (num_emitted > 1).double().mean().item()
    assert kept_first == pytest.approx(target[0, 4].item(), abs=0.01)
    # a rejected point-mass draft is replaced by a draw from the target without that token
    rejected = token_ids[num_emitted == 1, 0]
    assert not (rejected == 4).any()
    without = target[0].clone()
    without[4] = 0
    assert chi_square_p_value(rejected, without / without.sum()) > 1e-3
