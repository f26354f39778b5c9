"""One request's logprobs: a {token id: Logprob} dict per position, made as each step brings it."""

from nanovllm.engine.messages import TokenLogprobs
from nanovllm.frontend.token_texts import TokenTexts
from nanovllm.outputs import Logprob, PositionLogprobs


class RequestLogprobs:
    """The positions of one request's logprobs (or prompt logprobs) so far, each a {token id: Logprob} dict.

    A position is made as its step comes in, while the device runs the next
    step, so that the cost is spread evenly over the steps: made when a request
    finishes, all its positions would fall into one step and hold the device up
    whenever the steps are short. `Logprob` is out of the cycle
    collector's reach, and so is a dict that holds only them, so the positions
    cost the collector nothing however many pile up. `positions` starts with
    `leading` (prompt logprobs have None for the first prompt token).
    `token_texts` gives the tokens' texts (None without a tokenizer: no text).
    """

    def __init__(self, token_texts: TokenTexts | None, leading: tuple = ()):
        self._token_texts = token_texts
        self.positions: list[PositionLogprobs | None] = list(leading)

    def add(self, entry: TokenLogprobs) -> None:
        """Add one position: the chosen (or actual) token with its own rank, then the top alternatives (ranks
        1, 2, ...) that are not that token."""
        ids, logprobs = entry.token_ids, entry.logprobs
        texts = [None] * len(ids) if self._token_texts is None else self._token_texts(ids)
        position = {ids[0]: Logprob(logprobs[0], entry.rank, texts[0])}
        for rank in range(1, len(ids)):
            position.setdefault(ids[rank], Logprob(logprobs[rank], rank, texts[rank]))
        self.positions.append(position)
