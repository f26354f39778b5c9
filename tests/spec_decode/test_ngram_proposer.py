"""The n-gram proposer: the latest earlier occurrence of the longest suffix in range, checked against a plain
loop over random sequences."""

import random

import pytest

from nanovllm.spec_decode.ngram_proposer import NgramProposer


def reference(ids: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The specification, one n and one position at a time."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[-n:]
        for end in range(len(ids) - 1, n - 1, -1):  # an occurrence ending before the last token, latest first
            if ids[end - n : end] == suffix:
                return ids[end : end + k]
    return []


def proposals(proposer: NgramProposer, batch: list[list[int]], max_drafts: list[int]) -> list[list[int]]:
    """The proposer's drafts for a batch of requests named 0, 1, ..."""
    return proposer.propose(batch, max_drafts, [str(i) for i in range(len(batch))])


def test_proposes_what_followed_the_latest_occurrence():
    proposer = NgramProposer(8, 1, 3)
    # "7 8 9" occurred twice; the latest is followed by 4 5
    ids = [7, 8, 9, 1, 2, 7, 8, 9, 4, 5, 6, 7, 8, 9]
    assert proposals(proposer, [ids], [2]) == [[4, 5]]


def test_a_longer_match_wins_over_a_later_shorter_one():
    proposer = NgramProposer(8, 1, 3)
    ids = [5, 6, 9, 1, 2, 3, 6, 9, 7, 7, 5, 6, 9]
    assert proposals(proposer, [ids], [3]) == [[1, 2, 3]]


def test_nothing_below_the_minimum_length_and_nothing_beyond_max_drafts():
    proposer = NgramProposer(8, 2, 2)
    assert proposals(proposer, [[3, 4, 5, 6, 4], [1, 2, 3, 1, 2], [9]], [3, 0, 3]) == [[], [], []]
    assert proposals(proposer, [[1, 2, 3, 1, 2]], [5]) == [[3, 1, 2]]


def test_proposals_stop_at_the_end_of_the_context():
    assert proposals(NgramProposer(8, 1, 1), [[4, 4, 4]], [5]) == [[4]]


@pytest.mark.parametrize("min_n, max_n", [(1, 1), (1, 4), (2, 3), (3, 5)])
def test_a_batch_matches_the_plain_loop(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    # a small alphabet repeats n-grams often; lengths from 1 up, batched together
    batch = [[rng.randrange(4) for _ in range(rng.randrange(1, 60))] for _ in range(200)]
    max_drafts = [rng.randrange(0, 6) for _ in batch]
    expected = [reference(ids, min_n, max_n, min(k, 4)) if k else [] for ids, k in zip(batch, max_drafts)]
    assert proposals(NgramProposer(4, min_n, max_n), batch, max_drafts) == expected
    assert any(expected) and not all(expected)
