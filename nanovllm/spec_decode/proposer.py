"""What the scheduler asks of a speculative method: guesses of each request's next tokens."""

from abc import ABC, abstractmethod


class Proposer(ABC):
    """Guesses the tokens that follow each of a batch of requests, from their confirmed token ids.

    The scheduler asks once per step, for the running requests that may
    speculate, and schedules each request's guesses behind its last token; the
    model then checks them all in one forward pass. A method that proposes with
    a model of its own (a draft model) keeps state per request id, which it
    drops when the scheduler `release`s the request.
    `num_speculative_tokens` is the most guesses per request and step.
    A method that `proposes_ahead` may be asked about a request whose newest
    token is still in flight (its value unknown): it is then asked for one
    guess more, and the first, which stands for the token in flight, is
    dropped. The engine then keeps launching a step before reading the one
    before it back; a method that cannot (a draft model must read every token)
    makes each step wait for the one before.
    """

    num_speculative_tokens: int
    proposes_ahead: bool = False

    @abstractmethod
    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        """Per request (its prompt then completion, every token confirmed, and its id): at most
        `max_drafts[i]` guesses of the tokens that follow, possibly none."""

    def receive(self, request_id: str, num_tokens: int, drafts: list[int]) -> None:
        """Drafts the model runner made beside a step (method "mtp"), for the request once it has `num_tokens`
        tokens, all confirmed. A method that proposes on the host gets none."""

    def release(self, request_id: str) -> None:
        """The request no longer runs (it finished, was aborted or preempted): drop what is kept for it.
        A method that keeps nothing per request ignores it."""

    def close(self) -> None:
        """Free what the method holds on the device now rather than when it is collected."""
