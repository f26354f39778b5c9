"""The n-gram proposer: the latest earlier occurrence of the longest suffix in range, checked against a plain
loop over random sequences."""

import random

import pytest

from nanovllm.spec_decode import ngram_proposer
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
    expected = [reference(ids, min_n, max_n, k) if k else [] for ids, k in zip(batch, max_drafts)]
    assert proposals(NgramProposer(4, min_n, max_n), batch, max_drafts) == expected
    assert any(expected) and not all(expected)


def grow(rng: random.Random, ids: list[int], alphabet: int) -> None:
    """Append 1 to 3 random tokens, as a step that accepted drafts does."""
    ids.extend(rng.randrange(alphabet) for _ in range(rng.randrange(1, 4)))


def random_requests(rng: random.Random, count: int, alphabet: int, shortest: int, longest: int) -> dict[str, list[int]]:
    """`count` requests of `shortest` to `longest` - 1 random tokens below `alphabet`, by request id."""
    return {f"r{i}": [rng.randrange(alphabet) for _ in range(rng.randrange(shortest, longest))] for i in range(count)}


def append_mostly_the_match(
    rng: random.Random, ids: list[int], min_n: int, max_n: int, alphabet: int, share: float
) -> None:
    """Append, with probability `share`, the token that followed the match of `ids` (where it has one),
    else a random token below `alphabet`."""
    draft = reference(ids, min_n, max_n, 1)
    ids.append(draft[0] if draft and rng.random() < share else rng.randrange(alphabet))


def check_batch(proposer: NgramProposer, batch: dict[str, list[int]], rng: random.Random) -> list[list[int]]:
    """Propose for `batch` (request id -> tokens) with random max_drafts, checked against the plain loop."""
    max_drafts = [rng.randrange(0, 6) for _ in batch]
    expected = [
        reference(ids, proposer.min_n, proposer.max_n, k) if k > 0 else [] for ids, k in zip(batch.values(), max_drafts)
    ]
    assert proposer.propose(list(batch.values()), max_drafts, list(batch)) == expected
    return expected


@pytest.mark.parametrize("min_n, max_n", [(1, 1), (1, 4), (2, 3), (3, 5), (5, 5)])
def test_requests_that_grow_between_calls_match_the_plain_loop(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    proposer = NgramProposer(4, min_n, max_n)
    alphabet = 3
    # from a single token up, past max_n, to contexts long enough that every n-gram recurs
    requests = random_requests(rng, 12, alphabet, 1, 30)
    drafts = []
    for step in range(60):
        for ids in requests.values():
            grow(rng, ids, alphabet)
        # a request left out of a step (not a candidate then) comes back having gained more tokens
        batch = {rid: ids for rid, ids in requests.items() if rng.random() < 0.8}
        drafts += check_batch(proposer, batch, rng)
    assert any(drafts) and not all(drafts)


@pytest.mark.parametrize("min_n, max_n", [(1, 1), (2, 4), (5, 5)])
def test_a_request_left_out_of_many_steps_matches_the_plain_loop(min_n, max_n):
    rng = random.Random(min_n * 3 + max_n)
    proposer = NgramProposer(4, min_n, max_n)
    alphabet = 4
    requests = random_requests(rng, 8, alphabet, 5, 60)
    for step in range(40):
        for ids in requests.values():
            if rng.random() < 0.2:
                # many tokens at once, entered in one pass, whose n-grams occurred before too
                ids.extend(rng.randrange(alphabet) for _ in range(rng.randrange(16, 60)))
            else:
                # mostly the token that followed the match, so that the next step goes on from it
                append_mostly_the_match(rng, ids, min_n, max_n, alphabet, 0.8)
        check_batch(proposer, requests, rng)


@pytest.mark.parametrize("min_n, max_n", [(1, 3), (4, 4)])
def test_a_released_request_id_comes_back_with_other_tokens(min_n, max_n):
    rng = random.Random(min_n + max_n)
    proposer = NgramProposer(4, min_n, max_n)
    alphabet = 4
    requests = random_requests(rng, 8, alphabet, 5, 40)
    for step in range(80):
        for ids in requests.values():
            grow(rng, ids, alphabet)
        check_batch(proposer, requests, rng)
        if step % 4 == 3:
            # finished or preempted: released; the id comes back with a list of its own, longer or shorter
            rid = rng.choice(list(requests))
            proposer.release(rid)
            requests[rid] = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 80))]
    proposer.release("never-seen")


@pytest.mark.parametrize("min_n, max_n", [(1, 2), (3, 3)])
def test_a_list_shorter_than_the_indexed_one_is_indexed_anew(min_n, max_n):
    rng = random.Random(min_n * max_n)
    proposer = NgramProposer(4, min_n, max_n)
    alphabet = 3
    requests = random_requests(rng, 8, alphabet, 20, 60)
    for step in range(40):
        for ids in requests.values():
            grow(rng, ids, alphabet)
        check_batch(proposer, requests, rng)
        # without a release, a request's list comes back shorter: cut short, or other tokens altogether
        rid = rng.choice(list(requests))
        ids = requests[rid]
        if step % 2:
            del ids[rng.randrange(1, len(ids)) :]
        else:
            requests[rid] = [rng.randrange(alphabet) for _ in range(rng.randrange(1, len(ids)))]
        check_batch(proposer, requests, rng)


@pytest.mark.parametrize("min_n, max_n", [(1, 4), (3, 3)])
def test_an_entry_of_another_ngram_with_the_same_hash_falls_back_to_a_search(monkeypatch, min_n, max_n):
    # a hash that collides all the time: the entries found are mostly other n-grams'
    monkeypatch.setattr(ngram_proposer, "_hash", lambda ngram: ngram[-1] % 2)
    rng = random.Random(7)
    proposer = NgramProposer(4, min_n, max_n)
    requests = random_requests(rng, 8, 4, 1, 30)
    drafts = []
    for step in range(30):
        for ids in requests.values():
            grow(rng, ids, 4)
        drafts += check_batch(proposer, requests, rng)
    assert any(drafts) and not all(drafts)


def test_a_step_hashes_only_the_new_ngrams(monkeypatch):
    hashed = []
    monkeypatch.setattr(ngram_proposer, "_hash", lambda ngram: hashed.append(ngram) or hash(ngram))
    rng = random.Random(3)
    proposer = NgramProposer(4, 2, 4)
    # tokens that never recur: every suffix is looked up (none goes on from a match)
    fresh = iter(rng.sample(range(10**6), 10_000))
    requests = {f"r{i}": [next(fresh) for _ in range(1000)] for i in range(4)}
    check_batch(proposer, requests, rng)
    assert len(hashed) > 3 * 4 * 990  # the first call enters every n-gram of the history
    for new_tokens in (1, 3, 1):
        hashed.clear()
        for ids in requests.values():
            ids.extend(next(fresh) for _ in range(new_tokens))
        check_batch(proposer, requests, rng)
        # per request and n: the n-grams that end at the new positions, the suffix last
        assert len(hashed) == len(requests) * 3 * new_tokens


@pytest.mark.parametrize("min_n, max_n", [(1, 1), (2, 4), (5, 5)])
def test_a_request_that_copies_from_its_context_hashes_nothing(monkeypatch, min_n, max_n):
    hashed = []
    monkeypatch.setattr(ngram_proposer, "_hash", lambda ngram: hashed.append(ngram) or hash(ngram))
    rng = random.Random(min_n + max_n)
    proposer = NgramProposer(4, min_n, max_n)
    text = rng.sample(range(10**6), 300)
    # one request repeats a stretch of its text and goes on copying it; the new tokens of the other never recur
    requests = {"copies": text + text[100:110], "fresh": text[:]}
    drafts = check_batch(proposer, requests, rng)
    for step in range(30):
        hashed.clear()
        requests["copies"].append(text[110 + step])  # the token that followed the last call's match
        requests["fresh"].append(10**6 + step)
        drafts += check_batch(proposer, requests, rng)
        # the suffixes of the request that does not copy, one per n, and none of the other's
        assert sorted(hashed) == sorted(tuple(requests["fresh"][-n:]) for n in range(min_n, max_n + 1))
    assert any(drafts)
    # tokens that do not follow the match: entered and looked up; then the copy goes on from the new match
    requests = {"copies": requests["copies"] + text[:5]}
    check_batch(proposer, requests, rng)
    hashed.clear()
    requests["copies"].append(text[5])
    check_batch(proposer, requests, rng)
    assert not hashed


@pytest.mark.parametrize("min_n, max_n", [(1, 3), (2, 2), (4, 4)])
def test_a_list_as_long_as_the_last_one_gets_its_draft_or_is_entered_anew(min_n, max_n):
    rng = random.Random(min_n * 7 + max_n)
    proposer = NgramProposer(4, min_n, max_n)
    alphabet = 3
    requests = random_requests(rng, 8, alphabet, 5, 40)
    for step in range(60):
        for ids in requests.values():
            # mostly the token that followed the match, as where a step keeps the drafts
            append_mostly_the_match(rng, ids, min_n, max_n, alphabet, 0.7)
        check_batch(proposer, requests, rng)
        # asked again at the same length: the same list, or one whose last token changed (as where a step
        # rejected the drafts in flight that the last call saw)
        requests[rng.choice(list(requests))][-1] = rng.randrange(alphabet)
        check_batch(proposer, requests, rng)
