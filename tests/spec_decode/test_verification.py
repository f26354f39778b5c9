"""The check of point-mass drafts: each request keeps its drafts while they equal the tokens sampled at
their positions, then emits the token sampled at the first mismatch (or after the last draft); sampled
that way, the emitted tokens follow the target's distribution (chi-square)."""

import pytest
import torch

from nanovllm.sample.metadata import SamplingTensors
from nanovllm.sample.sampler import Sampler
from nanovllm.spec_decode.verification import verify_drafts, verify_padded

from helpers.chi_square import chi_square_p_value


def to_device(values, dtype):
    return torch.tensor(values, dtype=dtype)


def test_drafts_are_kept_up_to_the_first_mismatch():
    # rows: request a has drafts [5, 6, 7] (rows 0-3), b none (row 4), c drafts [9, 9] (rows 5-7)
    sampled = torch.tensor([5, 6, 8, 2, 4, 3, 9, 9])
    verified = verify_drafts(sampled, [[5, 6, 7], [], [9, 9]], to_device)
    assert verified.row_starts == [0, 4, 5]
    # a keeps 5 and 6, then emits the 8 sampled where it drafted 7; b emits its one token; c's first draft fails
    assert verified.num_emitted.tolist() == [3, 1, 1]
    assert verified.last_token_ids.tolist() == [8, 4, 3]
    # what a step launched before the check moves back by: the drafts after the kept ones
    assert verified.num_rejected.tolist() == [1, 0, 2]


def test_a_fully_kept_run_ends_with_the_token_after_the_last_draft():
    sampled = torch.tensor([1, 2, 3, 4, 7, 8])
    verified = verify_drafts(sampled, [[1, 2, 3], [7]], to_device)
    assert verified.num_emitted.tolist() == [4, 2]
    assert verified.last_token_ids.tolist() == [4, 8]
    assert verified.num_rejected.tolist() == [0, 0]


def test_a_padded_verify_step_keeps_what_the_unpadded_check_keeps():
    # the same drafts as above, each request padded to 4 rows: the padding queries' input ids (0 here) and
    # samples never extend a run, even where a padding row's sample equals its input id
    drafts = [[5, 6, 7], [], [9, 9]]
    unpadded = torch.tensor([5, 6, 8, 2, 4, 3, 9, 9])
    sampled = torch.tensor([5, 6, 8, 2, 4, 0, 0, 0, 3, 9, 9, 0])
    draft_ids = torch.tensor([[5, 6, 7], [0, 0, 0], [9, 9, 0]])
    is_draft = torch.tensor([[True] * 3, [False] * 3, [True, True, False]])
    padded = verify_padded(sampled, draft_ids, is_draft)
    expected = verify_drafts(unpadded, drafts, to_device)
    assert padded.row_starts == [0, 4, 8]
    assert padded.num_emitted.tolist() == expected.num_emitted.tolist() == [3, 1, 1]
    assert padded.last_token_ids.tolist() == expected.last_token_ids.tolist() == [8, 4, 3]
    assert padded.num_rejected.tolist() == expected.num_rejected.tolist() == [1, 0, 2]
    # every draft kept: the token after the last one ends the run
    all_kept = verify_padded(torch.tensor([5, 6, 7, 1]), torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.bool))
    assert all_kept.num_emitted.tolist() == [4] and all_kept.last_token_ids.tolist() == [1]
    assert all_kept.num_rejected.tolist() == [0]


def test_point_mass_drafts_checked_by_sampling_keep_the_targets_distribution():
    # every request drafts token 2 at its first position; its rows are sampled at temperature 0.8
    vocab, requests = 6, 30_000
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, vocab, generator=generator)  # the first position's, then the next one's
    rows = logits.repeat(requests, 1)  # [requests * 2, vocab]: each request's two rows
    torch.manual_seed(1)
    sampled = Sampler()(rows, SamplingTensors(temperatures=torch.full((rows.size(0),), 0.8))).token_ids
    verified = verify_drafts(sampled, [[2]] * requests, to_device)
    starts = torch.tensor(verified.row_starts)
    first = sampled[starts]  # the first emitted token: the kept draft or the sample that replaced it
    target = torch.softmax(logits / 0.8, dim=-1)
    assert chi_square_p_value(first, target[0]) > 1e-3
    kept = verified.num_emitted == 2
    assert kept.double().mean().item() == pytest.approx(target[0, 2].item(), abs=0.01)
    # after a kept draft, the next token follows the next position's distribution
    assert chi_square_p_value(verified.last_token_ids[kept], target[1]) > 1e-3
