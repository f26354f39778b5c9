"""What the scheduler asks of a speculative method: guesses of each request's next tokens."""

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanovllm.spec_decode.speculative_config import SpeculativeConfig


class Proposer(ABC):
    """Guesses the tokens that follow each of a batch of requests, from their confirmed token ids.

    The scheduler asks once per step, for the running requests that may
    speculate, and schedules each request's guesses behind its last token; the
    model then checks them all in one forward pass. A method that proposes with
    a model of its own (a draft model) implements the same call.
    `num_speculative_tokens` is the most guesses per request and step.
    """

    num_speculative_tokens: int

    @abstractmethod
    def propose(self, token_ids: list[list[int]], max_drafts: list[int]) -> list[list[int]]:
        """Per request (its prompt then completion, every token confirmed): at most `max_drafts[i]` guesses of
        the tokens that follow, possibly none."""


def make_proposer(config: "SpeculativeConfig | None") -> Proposer | None:
    """The proposer of the configured method; None without speculation."""
    if config is None:
        return None
    assert config.method == "ngram", f"method {config.method!r} is refused where the config is read"
    from nanovllm.spec_decode.ngram_proposer import NgramProposer

    return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
