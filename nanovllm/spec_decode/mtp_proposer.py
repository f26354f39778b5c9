"""Multi-token-prediction speculation on the scheduler's side: the drafts that the model runner made beside
each step (`worker/mtp_drafter.py`), handed out at the next."""

from nanovllm.spec_decode.proposer import Proposer


class MTPProposer(Proposer):
    """Proposes, for each request, the drafts the target's multi-token-prediction layer made after its last
    confirmed token, which came back with the step that sampled it (`receive`).

    The drafts need the step's sampled ids before the next step is built, so
    the engine reads every step back before it schedules the next (no
    `proposes_ahead`). Drafts are kept per request id with the token count they
    follow: a request whose tokens changed since (none came for its latest
    step) gets none, and `release` drops them.
    """

    def __init__(self, num_speculative_tokens: int):
        self.num_speculative_tokens = num_speculative_tokens
        self._drafts: dict[str, tuple[int, list[int]]] = {}  # request id -> (its tokens then, the drafts after)

    def receive(self, request_id: str, num_tokens: int, drafts: list[int]) -> None:
        self._drafts[request_id] = (num_tokens, drafts)

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        """The drafts received for each request at its present length, at most `max_drafts[i]` of them."""
        proposals = []
        for ids, room, request_id in zip(token_ids, max_drafts, request_ids):
            num_tokens, drafts = self._drafts.get(request_id, (-1, []))
            proposals.append(drafts[:room] if num_tokens == len(ids) else [])
        return proposals

    def release(self, request_id: str) -> None:
        self._drafts.pop(request_id, None)
