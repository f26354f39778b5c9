"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of a request's last n tokens."""

from operator import itemgetter

from nanovllm.spec_decode.proposer import Proposer

# the hash of an n-gram (a tuple of token ids); a module global so that tests can swap in one that collides
_hash = hash
# below this many new positions, n-grams are hashed one at a time; from this many on, in one pass
_BULK = 16


class _History:
    """What is indexed of one request: the n-grams of its first `length` tokens.

    `ends[i]` (one dict per n, longest n first) maps the hash of every n-gram
    that ends before the last of those tokens, at position e (it is tokens
    e - n .. e - 1), to the largest such e: where its latest occurrence ends,
    which is where its draft starts. `last[i]` is the hash of the n-gram that
    ends at `length` (the suffix looked up at that length), to be entered
    once a token follows it; None while there are fewer than max_n tokens.
    """

    __slots__ = ("length", "ends", "last")

    def __init__(self, length: int, ends: tuple[dict[int, int], ...]):
        self.length = length
        self.ends = ends
        self.last: tuple[int, ...] | None = None


class NgramProposer(Proposer):
    """For each request, the longest n in [`min_n`, `max_n`] such that its last n tokens occurred before
    (the latest such occurrence), and up to `max_drafts` tokens that followed it there. A lookup needs no
    token in flight, so it `proposes_ahead`: from the tokens before one in flight, the tokens that followed
    the match stand for it and for those after it.

    Searching the whole context for the suffix costs O(context) per request
    and step, on the host, in every step: tens of ms for 256 requests of
    4,000 tokens. But a request's tokens only grow, by a token or a few a
    step. So the proposer keeps, per request id, an index of the n-grams seen
    so far (`_History`): for each n, a dict from the hash of an n-gram to
    where its latest occurrence ends. A call enters only the n-grams that end
    at the positions added since the last call, then looks the suffix up,
    longest n first: O(new tokens x number of n's) per request, whatever the
    context's length. The suffixes hashed at the last call are the first
    n-grams to enter, so a request that gained one token costs one hash per
    n. A request seen for the first time has its whole history indexed
    once, in one pass per n that runs in C; `release` drops the index.

    The index trusts that a request's list only grows between calls (the
    scheduler appends to it, and releases the request before its id may come
    back with other tokens). As a safety net, a list shorter than the indexed
    one, or as long but with other suffixes, is indexed anew; a longer list
    whose indexed tokens were changed is not noticed.

    The dicts hold the hashes (ints) rather than the tuples: a dict of ints
    holds nothing that the cycle collector walks, where the tuples of 256
    contexts of 4,000 tokens would add tens of ms to every full collection,
    and ints take less memory (about 56 bytes an n-gram and n: 57 MB for 256
    such contexts and one n). A hit is checked against the tokens; should it
    be another n-gram of the same hash (entered later, it took over the
    entry), the context is searched instead, so proposals are exact.

    Min_n == max_n (the default) runs a loop of its own, without the loops
    over n: the step's Python work per request is what sets its cost
    (benchmarks/ngram_proposer.py).
    """

    proposes_ahead = True

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int):
        assert 1 <= min_n <= max_n
        self.num_speculative_tokens = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n
        # longest first: n, and a function that gives a list's last n items as a tuple
        self._suffixes = tuple(
            (n, itemgetter(*range(-n, 0)) if n > 1 else _last_token) for n in range(max_n, min_n - 1, -1)
        )
        self._histories: dict[str, _History] = {}

    def release(self, request_id: str) -> None:
        self._histories.pop(request_id, None)

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        """The tokens after each request's best match, once the index of each request id has taken in its
        new tokens."""
        if len(self._suffixes) == 1:
            return self._propose_one_n(token_ids, max_drafts, request_ids)
        history_of = self._histories.get
        suffixes = self._suffixes
        proposals: list[list[int]] = []
        append = proposals.append
        for ids, room, request_id in zip(token_ids, max_drafts, request_ids):
            length = len(ids)
            history = history_of(request_id)
            if history is not None and history.length + 1 == length and history.last is not None:
                # one new token: the n-grams that end before it are the suffixes hashed at the last call
                for key, ends in zip(history.last, history.ends):
                    ends[key] = history.length
                history.length = length
            else:
                history = self._catch_up(request_id, ids, history)
            if length < self.max_n:
                append(self._propose_short(ids, room))
                continue
            draft = None
            last = []
            for (n, suffix_of), ends in zip(suffixes, history.ends):
                suffix = suffix_of(ids)
                key = _hash(suffix)
                last.append(key)
                if draft is None and room > 0 and (end := ends.get(key)) is not None:
                    if tuple(ids[end - n : end]) != suffix:
                        end = _search(ids, suffix)  # the entry was another n-gram's
                    if end:
                        draft = ids[end : end + room]
            history.last = tuple(last)
            append([] if draft is None else draft)
        return proposals

    def _propose_one_n(
        self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]
    ) -> list[list[int]]:
        """`propose` for a single n: the same steps, with one dict and one suffix per request."""
        history_of = self._histories.get
        ((n, suffix_of),) = self._suffixes
        proposals: list[list[int]] = []
        append = proposals.append
        for ids, room, request_id in zip(token_ids, max_drafts, request_ids):
            length = len(ids)
            history = history_of(request_id)
            if history is not None and history.length + 1 == length and history.last is not None:
                ends = history.ends[0]
                ends[history.last[0]] = history.length
                history.length = length
            else:
                history = self._catch_up(request_id, ids, history)
                ends = history.ends[0]
                if length < n:
                    append(self._propose_short(ids, room))
                    continue
            suffix = suffix_of(ids)
            key = _hash(suffix)
            history.last = (key,)
            if room <= 0 or (end := ends.get(key)) is None:
                append([])
                continue
            if tuple(ids[end - n : end]) != suffix:
                end = _search(ids, suffix)  # the entry was another n-gram's
            append(ids[end : end + room] if end else [])
        return proposals

    def _catch_up(self, request_id: str, ids: list[int], history: _History | None) -> _History:
        """`history` (None: the request is new) brought up to `ids` where a call's fast path cannot: several
        new tokens, none, or a list that does not continue the indexed one."""
        length = len(ids)
        if history is not None and (
            history.length < length
            or (history.length == length and history.last is not None and history.last == self._suffix_hashes(ids))
        ):
            self._extend(history, ids)
            return history
        history = self._histories[request_id] = self._index(ids)
        return history

    def _index(self, ids: list[int]) -> _History:
        """A new index of every n-gram of `ids` that ends before its last token (the caller hashes the
        suffixes)."""
        length = len(ids)
        history = _History(length, tuple({} for _ in self._suffixes))
        for (n, _), ends in zip(self._suffixes, history.ends):
            _enter(ends, ids, n, n, length)
        return history

    def _extend(self, history: _History, ids: list[int]) -> None:
        """Enter the n-grams that end from `history.length` to before the last of `ids` (the caller hashes
        the suffixes)."""
        first, length = history.length, len(ids)
        if history.last is not None and first < length:
            # the n-grams that end at the old length were the suffixes hashed then
            for key, ends in zip(history.last, history.ends):
                ends[key] = first
            first += 1
        for (n, _), ends in zip(self._suffixes, history.ends):
            _enter(ends, ids, n, max(first, n), length)
        history.length = length
        history.last = None  # until the caller hashes the new suffixes

    def _suffix_hashes(self, ids: list[int]) -> tuple[int, ...]:
        return tuple(_hash(suffix_of(ids)) for _, suffix_of in self._suffixes)

    def _propose_short(self, ids: list[int], num_drafts: int) -> list[int]:
        """The draft of a list of fewer than max_n tokens, searched for (it is that short)."""
        for n, _ in self._suffixes:
            if n < len(ids) and num_drafts > 0 and (end := _search(ids, tuple(ids[-n:]))):
                return ids[end : end + num_drafts]
        return []


def _last_token(ids: list[int]) -> tuple[int]:
    return (ids[-1],)


def _enter(ends: dict[int, int], ids: list[int], n: int, first: int, stop: int) -> None:
    """Enter in `ends` the n-grams of `ids` that end at positions `first` to `stop` - 1 (`first` >= n), in
    order, so that an n-gram's latest end wins."""
    if stop - first < _BULK:
        for end in range(first, stop):
            ends[_hash(tuple(ids[end - n : end]))] = end
    else:
        # the tuples of n consecutive tokens, from n slices each shifted by one
        ngrams = zip(*[ids[first - n + i : stop - n + i] for i in range(n)])
        ends.update(zip(map(_hash, ngrams), range(first, stop)))


def _search(ids: list[int], suffix: tuple[int, ...]) -> int:
    """The end of the latest occurrence of `suffix` that ends before the last token of `ids`, or 0 if there
    is none: the fallback for an entry that another n-gram of the same hash took over."""
    n = len(suffix)
    for end in range(len(ids) - 1, n - 1, -1):
        if ids[end - 1] == suffix[-1] and tuple(ids[end - n : end]) == suffix:
            return end
    return 0
