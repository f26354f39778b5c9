"""What the scheduler asks of a speculative method: guesses of each request's next tokens."""

from abc import ABC, abstractmethod


class Proposer(ABC):
    """Guesses the tokens that follow each of a batch of requests, from their confirmed token ids.

    The scheduler asks once per step, for the running requests that may
    speculate, and schedules each request's guesses behind its last token; the
    model then checks them all in one forward pass. A method that proposes with
    a model of its own (a draft model) implements the same call.
    """

    @abstractmethod
    def propose(self, token_ids: list[list[int]], max_drafts: list[int]) -> list[list[int]]:
        """Per request (its prompt then completion, every token confirmed): at most `max_drafts[i]` guesses of
        the tokens that follow, possibly none."""
