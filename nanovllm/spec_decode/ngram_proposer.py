"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of a request's last n tokens."""

from operator import itemgetter

from nanovllm.spec_decode.proposer import Proposer

# the hash of an n-gram (a tuple of token ids); a module global so that tests can swap in one that collides
_hash = hash
# below this many new positions, n-grams are entered one at a time; from this many on, in one pass
_BULK = 16


class _History:
    """The occurrences of one request's n-grams, up to its `length`-th token, and the last call's match.

    An occurrence is named by where it ends: e, for tokens e - n .. e - 1.
    For each n (longest first), `ends_by_n[i]` maps the hash of an n-gram to
    one of its occurrences, and `links_by_n[i]` maps each occurrence that is
    not the latest of its hash to a later one of the same hash, so that from
    any occurrence the links lead to the latest of its hash. `ends` and
    `links` are the longest n's, on their own for the loop of a single n.
    `start` is where the last call's draft started: the latest earlier
    occurrence of its longest suffix that had one, `matched` tokens long; 0
    if none had (`matched` is then stale).
    """

    __slots__ = ("length", "start", "matched", "ends", "links", "ends_by_n", "links_by_n")

    def __init__(self, num_n: int, max_n: int):
        self.length = self.start = 0
        # with a single n, every match is max_n long: the loop of a single n leaves `matched` as it is
        self.matched = max_n
        self.ends_by_n: tuple[dict[int, int], ...] = tuple({} for _ in range(num_n))
        self.links_by_n: tuple[dict[int, int], ...] = tuple({} for _ in range(num_n))
        self.ends, self.links = self.ends_by_n[0], self.links_by_n[0]


class NgramProposer(Proposer):
    """For each request, the longest n in [`min_n`, `max_n`] such that its last n tokens occurred before
    (the latest such occurrence), and up to `max_drafts` tokens that followed it there. A lookup needs no
    token in flight, so it `proposes_ahead`: from the tokens before one in flight, the tokens that followed
    the match stand for it and for those after it.

    Searching the whole context for the suffix costs O(context) per request
    and step, on the host, in every step, which a large batch of long contexts
    cannot afford. But a request's tokens only grow, by a token or a few a
    step. So the proposer keeps, per request id, the occurrences of the
    n-grams seen so far (`_History`): for each n, a dict from the hash of an
    n-gram to one of its occurrences, and links from each occurrence to a
    later one of the same hash, which lead to the latest. A call enters the
    n-grams that end at the positions added since the last call, the suffix
    last, each linked after the latest earlier occurrence of its hash: for
    the suffix, that occurrence is the match. So a request that gained one
    token costs one hash per n, whatever the context's length. A request seen
    for the first time has its whole history entered once, in one pass per n
    that runs in C; `release` drops it.

    Most matches need no hash at all. While a request copies from earlier in
    its context, its one new token is the one that followed the last call's
    match (at `start`): then the occurrence a token after that match is one
    of every new suffix of up to `matched` + 1 tokens (a longer suffix
    occurred nowhere, or the last call would have matched one a token
    shorter), and the links from it lead to the latest. Such a step costs a
    comparison and a look at the links, where the dicts of hashes, large for
    long contexts, miss the caches at every lookup.

    The occurrences trust that a request's list only grows between calls (the
    scheduler appends to it, and releases the request before its id may come
    back with other tokens). As a safety net, a list shorter than the last
    one, or as long with other suffixes, is entered anew; as long with the
    same suffixes, it gets the last call's draft. A longer list whose earlier
    tokens were changed is not noticed.

    The dicts hold ints only (hashes and positions, rather than tuples): a
    dict of ints holds nothing that the cycle collector walks, where tuples,
    or lists of links (an item a position), would lengthen every full
    collection with the contexts' length. And ints take less memory
    (benchmarks/ngram_proposer.py). The latest occurrence of the suffix's hash
    is checked against the tokens; should it be another n-gram's, the context
    is searched instead, so proposals are exact.
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
        """The tokens after each request's best match, once the occurrences of each request id have taken in
        its new tokens."""
        if len(self._suffixes) == 1:
            return self._propose_one_n(token_ids, max_drafts, request_ids)
        history_of = self._histories.get
        proposals: list[list[int]] = []
        append = proposals.append
        for ids, room, request_id in zip(token_ids, max_drafts, request_ids):
            history = history_of(request_id)
            if history is None or history.length + 1 != len(ids):
                start = self._catch_up(request_id, ids, history)
            elif (last := history.start) and ids[last] == ids[-1]:
                start = self._go_on(history, ids, last + 1)
            else:
                start = self._look_up(history, ids)
            append(ids[start : start + room] if start else [])
        return proposals

    def _propose_one_n(
        self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]
    ) -> list[list[int]]:
        """`propose` for a single n: `_go_on` and `_look_up` on one dict of hashes and one of links, inline
        (the step's Python work per request sets its cost: benchmarks/ngram_proposer.py)."""
        history_of = self._histories.get
        ((_, suffix_of),) = self._suffixes
        proposals: list[list[int]] = []
        append = proposals.append
        for ids, room, request_id in zip(token_ids, max_drafts, request_ids):
            length = len(ids)
            history = history_of(request_id)
            if history is None or history.length + 1 != length:
                start = self._catch_up(request_id, ids, history)
            else:
                links = history.links
                if (last := history.start) and ids[last] == ids[-1]:
                    start = last + 1
                    if start in links:
                        start = _match(ids, suffix_of(ids), _link_latest(links, start, length), length)
                    else:
                        links[start] = length
                else:
                    ends = history.ends
                    suffix = suffix_of(ids)
                    key = _hash(suffix)
                    found = ends.get(key)
                    ends[key] = length
                    start = 0 if found is None else _match(ids, suffix, _link_latest(links, found, length), length)
                history.length = length
                history.start = start
            append(ids[start : start + room] if start else [])
        return proposals

    def _go_on(self, history: _History, ids: list[int], candidate: int) -> int:
        """Where the draft of `ids` starts when its one new token followed the last call's match: `candidate`,
        a token after that match, is an occurrence of each suffix of up to `matched` + 1 tokens, whose links lead
        to the latest. Enters the suffixes."""
        length = len(ids)
        reach = history.matched + 1
        start = 0
        for (n, suffix_of), ends, links in zip(self._suffixes, history.ends_by_n, history.links_by_n):
            if n > reach:
                # a suffix this long occurred nowhere before, or the last call would have matched one a token
                # shorter
                _enter(ends, links, _hash(suffix_of(ids)), length)
                continue
            if candidate in links:
                latest = _match(ids, suffix_of(ids), _link_latest(links, candidate, length), length)
            else:
                links[candidate] = length
                latest = candidate
            if not start:
                start, history.matched = latest, n
        history.length = length
        history.start = start
        return start

    def _look_up(self, history: _History, ids: list[int]) -> int:
        """Where the draft of `ids` starts (0: none), from the occurrences of the n-grams that end before its
        last token; enters the suffixes."""
        length = len(ids)
        start = 0
        for (n, suffix_of), ends, links in zip(self._suffixes, history.ends_by_n, history.links_by_n):
            suffix = suffix_of(ids)
            latest = _enter(ends, links, _hash(suffix), length)
            if not start and latest is not None and (end := _match(ids, suffix, latest, length)):
                start, history.matched = end, n
        history.length = length
        history.start = start
        return start

    def _catch_up(self, request_id: str, ids: list[int], history: _History | None) -> int:
        """`_look_up` where a call's fast path cannot: a new request, several new tokens, none, or a list that
        does not continue the last one."""
        length = len(ids)
        if length < self.max_n:
            # too short to hash every suffix: searched for, and entered once it is long enough
            self._histories.pop(request_id, None)
            return self._search_short(ids)
        if history is not None and length == history.length:
            if self._suffixes_entered(history, ids):
                return history.start  # the last call's list
            history = None
        if history is None or length < history.length:
            history = self._histories[request_id] = _History(len(self._suffixes), self.max_n)
        for (n, _), ends, links in zip(self._suffixes, history.ends_by_n, history.links_by_n):
            _enter_positions(ends, links, ids, n, max(history.length + 1, n), length)
        return self._look_up(history, ids)

    def _suffixes_entered(self, history: _History, ids: list[int]) -> bool:
        """Whether the suffixes of `ids` are the n-grams that the last call entered at its length."""
        start = history.start
        for (n, suffix_of), ends in zip(self._suffixes, history.ends_by_n):
            if start and n <= history.matched:
                # this suffix, and the shorter ones, end the last call's match
                return tuple(ids[start - n : start]) == suffix_of(ids)
            # the longer ones occurred nowhere before, so the last call entered them in the dict
            if ends.get(_hash(suffix_of(ids))) != history.length:
                return False
        return True

    def _search_short(self, ids: list[int]) -> int:
        """Where the draft of a list of fewer than max_n tokens starts (0: none), searched for (it is that
        short)."""
        for n, _ in self._suffixes:
            if n < len(ids) and (end := _search(ids, tuple(ids[-n:]), len(ids))):
                return end
        return 0


def _last_token(ids: list[int]) -> tuple[int]:
    return (ids[-1],)


def _enter(ends: dict[int, int], links: dict[int, int], key: int, end: int) -> int | None:
    """Enter the occurrence that ends at `end`, of an n-gram of hash `key`, after every earlier one; the
    latest earlier occurrence of that hash, now linked to it, or None if there is none."""
    found = ends.get(key)
    ends[key] = end
    return None if found is None else _link_latest(links, found, end)


def _enter_positions(ends: dict[int, int], links: dict[int, int], ids: list[int], n: int, first: int, stop: int):
    """Enter the n-grams of `ids` that end at positions `first` to `stop` - 1 (`first` >= n), after every
    earlier one."""
    if stop - first < _BULK:
        for end in range(first, stop):
            _enter(ends, links, _hash(tuple(ids[end - n : end])), end)
        return
    # the tuples of n consecutive tokens, from n slices each shifted by one
    keys = list(map(_hash, zip(*[ids[first - n + i : stop - n + i] for i in range(n)])))
    # from the last position back, the first of each hash is its latest, which the others link to
    positions = list(range(stop - 1, first - 1, -1))  # one int object a position, shared by both dicts
    latest_of: dict[int, int] = {}
    latest = map(latest_of.setdefault, reversed(keys), positions)
    links.update({end: to for end, to in zip(positions, latest) if end != to})
    if ends:  # (empty for a new request)
        # a hash that occurred before these positions: its latest occurrence then links to its latest now
        for key, to in latest_of.items():
            if (found := ends.get(key)) is not None:
                _link_latest(links, found, to)
    ends.update(latest_of)


def _link_latest(links: dict[int, int], end: int, to: int) -> int:
    """Link the latest occurrence that the links from `end` lead to, to the later one at `to`, and return
    it. Each occurrence on the way is linked to `to` directly, so that no walk from them takes as many steps
    again."""
    latest = end
    while (after := links.get(latest)) is not None:
        latest = after
    while end != latest:
        after = links[end]
        links[end] = to
        end = after
    links[latest] = to
    return latest


def _match(ids: list[int], ngram: tuple[int, ...], latest: int, end: int) -> int:
    """The latest occurrence of `ngram` that ends before `end` (0: none), given `latest`, the latest one of
    its hash: that one, unless it is another n-gram's."""
    n = len(ngram)
    if tuple(ids[latest - n : latest]) == ngram:
        return latest
    return _search(ids, ngram, end)


def _search(ids: list[int], ngram: tuple[int, ...], end: int) -> int:
    """The latest occurrence of `ngram` that ends before `end`, or 0 if there is none: the fallback where the
    latest occurrence of its hash is another n-gram's."""
    n = len(ngram)
    for stop in range(end - 1, n - 1, -1):
        if ids[stop - 1] == ngram[-1] and tuple(ids[stop - n : stop]) == ngram:
            return stop
    return 0
