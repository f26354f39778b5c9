"""Per-request sampling settings, named as in vLLM."""

from dataclasses import dataclass


@dataclass
class SamplingParams:
    """How to pick each new token and when to stop.

    `temperature=0` is greedy decoding (argmax); `max_tokens` caps the completion
    length; `ignore_eos` keeps generating past the end-of-sequence token.
    """

    temperature: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {self.temperature!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
