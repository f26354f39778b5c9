"""Per-request sampling settings, named and meant as in vLLM."""

import math
from dataclasses import dataclass, fields


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """A finite int or float: NaN and infinity pass no range check a user means."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SamplingParams:
    """How to pick each new token and when to stop.

    Choosing: `temperature=0` is greedy (argmax); otherwise tokens are drawn
    from softmax(logits / temperature), restricted by `min_p` (drop tokens less
    likely than min_p times the top one; 0 = off), then `top_k` (the k most
    likely; -1 or 0 = off) and `top_p` (the smallest set whose probability
    reaches top_p; 1 = off). `seed` makes one request's draws reproducible
    whatever else runs beside it. Before all that, `repetition_penalty` (1 =
    off) divides positive logits and multiplies negative ones of every token in
    the prompt or the completion; `frequency_penalty` subtracts itself once per
    earlier occurrence in the completion and `presence_penalty` once if the
    token occurred at all (0 = off).

    Stopping: at `max_tokens` (finish_reason "length"), or "stop" on an
    end-of-sequence token (unless `ignore_eos`), on any of `stop_token_ids`, or
    when the text contains one of the `stop` strings (a string or a list; kept
    as a list); the text is then cut
    before the stop string, or after it with `include_stop_str_in_output`
    (which also keeps a stop token's text). Nothing stops a completion shorter
    than `min_tokens`.

    `logprobs=k` reports, for each completion token, its log-probability and
    those of the k most likely tokens (from the model's raw logits). Only one
    completion per request: `n` and `best_of` must stay 1; `prompt_logprobs`
    is not supported and must stay None.
    `skip_special_tokens` leaves special tokens out of the text.
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int = 64
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    @classmethod
    def from_dict(cls, values: dict) -> "SamplingParams":
        """Build from a mapping (e.g. request fields), naming any key that is not a field."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {', '.join(unknown)}; "
                             f"valid ones are: {', '.join(sorted(known))}")
        return cls(**values)

    def __post_init__(self) -> None:
        self._check_single_completion()
        self._check_choice()
        self._check_penalties()
        self._check_stopping()
        if self.logprobs is not None and not (_is_int(self.logprobs) and self.logprobs >= 0):
            raise ValueError(f"logprobs must be None or an integer >= 0 (how many top alternatives), "
                             f"got {self.logprobs!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def _check_single_completion(self) -> None:
        if self.n != 1:
            raise ValueError(f"only n=1 is supported (one completion per request), got n={self.n!r}")
        if self.best_of not in (None, 1):
            raise ValueError(f"best_of is not supported; leave it unset or 1, got {self.best_of!r}")
        if self.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs is not supported; leave it unset (logprobs=k covers the completion)")

    def _check_choice(self) -> None:
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= 1, or -1 (or 0) to turn it off, got {self.top_k!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 turns it off), got {self.min_p!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be None or an integer, got {self.seed!r}")

    def _check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0 turns it off), got {value!r}")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be a number > 0 (1 turns it off), "
                             f"got {self.repetition_penalty!r}")

    def _check_stopping(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer from 0 to max_tokens={self.max_tokens}, "
                             f"got {self.min_tokens!r}")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        self.stop = list(stop)
        ids = self.stop_token_ids or []
        if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be a list of token ids (integers >= 0), "
                             f"got {self.stop_token_ids!r}")
        self.stop_token_ids = list(ids)
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
