"""One request's logprobs, kept flat as the steps bring them and made into Logprob dicts when read."""

from array import array

from nanovllm.engine.messages import TokenLogprobs
from nanovllm.frontend.token_texts import TokenTexts
from nanovllm.outputs import Logprob, PositionLogprobs


class LazyLogprobs:
    """The positions of one request's logprobs (or prompt logprobs), as {token id: Logprob} dicts when read.

    Making each position's dict as its step comes in costs several Python
    objects per token listed (for 256 rows of logprobs=5, some 1,800 a step),
    which then live as long as the request and which every full pass of the
    cycle collector walks again. Until an output is read the positions wait
    here in flat arrays, which the collector does not track; reading turns
    those waiting into dicts, each once (offline generation reads a request
    once, as it finishes). `built()` starts with `leading` (prompt logprobs have None for
    the first prompt token). `token_texts` gives the tokens' texts (None
    without a tokenizer: no text).
    """

    def __init__(self, token_texts: TokenTexts | None, leading: tuple = ()):
        self._token_texts = token_texts
        self._built: list[PositionLogprobs | None] = list(leading)
        # the positions not built yet: position i lists token_ids[ends[i - 1]:ends[i]], its first token's
        # rank is ranks[i]
        self._token_ids = array("q")
        self._logprobs = array("d")
        self._ranks = array("q")
        self._ends = array("q")

    def add(self, entry: TokenLogprobs) -> None:
        """Keep one position: the chosen (or actual) token, then the top alternatives."""
        self._token_ids.extend(entry.token_ids)
        self._logprobs.extend(entry.logprobs)
        self._ranks.append(entry.rank)
        self._ends.append(len(self._token_ids))

    def built(self) -> list[PositionLogprobs | None]:
        """Every position so far, after the leading entries; the same list each time, grown by the positions
        added since the last call."""
        if self._ends:
            self._built += self._positions()
            for pending in (self._token_ids, self._logprobs, self._ranks, self._ends):
                del pending[:]
        return self._built

    def _positions(self) -> list[PositionLogprobs]:
        """The waiting positions: the first token with its own rank, then the alternatives (ranks 1, 2, ...)
        that are not that token."""
        ids, logprobs = self._token_ids.tolist(), self._logprobs.tolist()
        texts = [None] * len(ids) if self._token_texts is None else self._token_texts(ids)
        positions = []
        start = 0
        for rank, end in zip(self._ranks, self._ends):
            position = {ids[start]: Logprob(logprobs[start], rank, texts[start])}
            for alternative_rank, i in enumerate(range(start + 1, end), start=1):
                position.setdefault(ids[i], Logprob(logprobs[i], alternative_rank, texts[i]))
            positions.append(position)
            start = end
        return positions
