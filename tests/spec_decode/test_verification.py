"""The check of point-mass drafts: each request keeps its drafts while they equal the tokens sampled at
their positions, then emits the token sampled at the first mismatch (or after the last draft)."""

import torch

from nanovllm.spec_decode.verification import verify_drafts


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


def test_a_fully_kept_run_ends_with_the_token_after_the_last_draft():
    sampled = torch.tensor([1, 2, 3, 4, 7, 8])
    verified = verify_drafts(sampled, [[1, 2, 3], [7]], to_device)
    assert verified.num_emitted.tolist() == [4, 2]
    assert verified.last_token_ids.tolist() == [4, 8]
