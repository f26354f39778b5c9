"""How many more tokens a running request is expected to write, so that admission leaves room for them.

A request admitted while the pool holds its prompt may later find no block for
its completion; then a request is preempted, and its whole sequence computed
again. Admission therefore looks ahead: it admits a request only where the
running requests and it, decoding to their expected ends, never hold more blocks
than the pool has (`KVCacheManager.peak_blocks`). A request is expected to
write its `max_tokens` (capped at `CAPPED_OUTPUT` tokens, so that a request
without a limit does not plan for the whole context), times the share of their
budget that finished requests wrote, times `Config.schedule_conservativeness`.
The share starts at 1 (a request may write every token it was allowed) and
follows the requests that finish, so that chat requests that stop at a few
hundred tokens of a large `max_tokens` are planned at about that much. An
estimate that falls short still ends in a preemption, as without it.
"""

import math

from nanovllm.core.request import Request

# the most tokens a request is expected to write however large its max_tokens: requests without a limit
# would otherwise plan for the whole context each
CAPPED_OUTPUT = 4096

# weight of each finished request in the running average of the share of its budget it wrote
_SHARE_WEIGHT = 1 / 32


class OutputEstimate:
    """Expects each running request to write `conservativeness` times `share` of its output budget.

    `max_model_len` bounds a budget where `max_tokens` is None (as many as
    the context holds); `conservativeness` 0 expects no output at all.
    """

    def __init__(self, max_model_len: int, conservativeness: float = 1.0):
        self.max_model_len = max_model_len
        self.conservativeness = conservativeness
        self.share = 1.0

    def budget(self, req: Request) -> int:
        """The most output tokens `req` may write, capped at `CAPPED_OUTPUT`."""
        limit = req.params.max_tokens if req.params.max_tokens is not None else math.inf
        return int(min(limit, self.max_model_len - req.num_prompt_tokens, CAPPED_OUTPUT))

    def final_tokens(self, req: Request) -> int:
        """The tokens `req` is expected to have when it finishes: at least those it has."""
        expected = req.num_prompt_tokens + math.ceil(self.conservativeness * self.share * self.budget(req))
        return max(req.num_tokens, expected)

    def observe(self, req: Request) -> None:
        """Count a request that finished by its own rules (not aborted): the share of its budget it wrote."""
        budget = self.budget(req)
        if budget > 0:
            wrote = min(1.0, req.num_output_tokens / budget)
            self.share += (wrote - self.share) * _SHARE_WEIGHT
