"""Per-request sampling settings, named and meant as in vLLM."""

import json
import math
from dataclasses import MISSING, dataclass, fields

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # every integer a request carries fits a signed 64-bit one


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """A finite int or float: NaN and infinity pass no range check a user means."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class StructuredOutputsParams:
    """Constrains a completion to a language; exactly one field is set.

    `json`: a JSON schema (a dict, or its text); `json_object`: any JSON
    object; `regex`: a regular expression; `choice`: one of these strings;
    `grammar`: an EBNF grammar (GBNF style, `root ::= ...`).
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"structured_outputs takes exactly one of json, json_object, regex, choice or grammar, "
                f"got {', '.join(given) or 'none'}"
            )
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"structured_outputs.json must be a JSON schema object, got {type(self.json).__name__}")
        if self.choice is not None and not (
            isinstance(self.choice, (list, tuple))
            and self.choice
            and all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(f"structured_outputs.choice must be a list of non-empty strings, got {self.choice!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")


@dataclass(init=False)
class SamplingParams:
    """How to pick each new token, how many completions to make, and when to stop.

    Choosing: `temperature=0` is greedy (argmax); otherwise tokens are drawn
    from softmax(logits / temperature), restricted by `min_p` (drop tokens less
    likely than min_p times the top one; 0 = off), then `top_k` (the k most
    likely; -1 or 0 = off) and `top_p` (the smallest set whose probability
    reaches top_p; 1 = off). `seed` makes one request's draws reproducible
    whatever else runs beside it. Before all that, `logit_bias` ({token id:
    bias}, each bias in [-100, 100]) is added to the logits, `repetition_penalty`
    (1 = off) divides positive logits and multiplies negative ones of every
    token in the prompt or the completion; `frequency_penalty` subtracts itself
    once per earlier occurrence in the completion and `presence_penalty` once
    if the token occurred at all (0 = off).

    Completions: `n` of them share the prompt (its KV blocks are computed once);
    with `best_of` > n, that many are made and the n with the highest
    cumulative log-probability are returned. With a seed, completion i draws
    from seed + i, so the same request gives the same n completions.

    Stopping: at `max_tokens` (None: as many as the context holds; finish_reason
    "length"), or "stop" on an end-of-sequence token (unless `ignore_eos`), on
    any of `stop_token_ids`, or when the text contains one of the `stop`
    strings (a string or a list; kept as a list); the text is then cut before
    the stop string, or after it with `include_stop_str_in_output` (which also
    keeps a stop token's text). Nothing stops a completion shorter than
    `min_tokens`.

    `logprobs=k` reports, for each completion token, its log-probability and
    rank and those of the k most likely tokens (from the model's raw logits);
    `prompt_logprobs=k` does the same for every prompt token after the first;
    -1 means the whole vocabulary.
    `skip_special_tokens` leaves special tokens out of the text.
    `structured_outputs` (a StructuredOutputsParams) keeps every completion
    inside a JSON schema, regex, choice or grammar; one that cannot finish
    within max_tokens ends with "length".

    Takes keywords only; an unknown one is a ValueError that names it.
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
    logit_bias: dict[int, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __init__(self, **kwargs):
        known = {f.name: f.default for f in fields(self)}
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise ValueError(
                f"unknown sampling parameter(s) {', '.join(unknown)}; valid ones are: {', '.join(sorted(known))}"
            )
        for name, default in known.items():
            assert default is not MISSING
            setattr(self, name, kwargs.get(name, default))
        self._check()

    @classmethod
    def from_dict(cls, values: dict) -> "SamplingParams":
        """Build from a mapping (e.g. request fields), naming any key that is not a field."""
        return cls(**values)

    def _check(self) -> None:
        self._check_int64()
        self._check_completions()
        self._check_choice()
        self._check_penalties()
        self._check_stopping()
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(
                f"structured_outputs must be a StructuredOutputsParams, got {type(self.structured_outputs).__name__}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= -1):
                raise ValueError(
                    f"{name} must be None, an integer >= 0 (how many top alternatives) or -1 (the "
                    f"whole vocabulary), got {value!r}"
                )

    def _check_int64(self) -> None:
        """Refuse integers beyond signed 64 bits, which the engine core's messages and tensors cannot carry."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = list(value)  # logit_bias: its token ids
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if _is_int(item) and not INT64_MIN <= item <= INT64_MAX:
                    raise ValueError(
                        f"{f.name} holds {item}, beyond the signed 64-bit range "
                        f"[-2**63, 2**63 - 1] that every integer setting must fit"
                    )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def num_completions(self) -> int:
        """How many completions are made: best_of when set, else n."""
        return self.best_of or self.n

    def _check_completions(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1 (completions to return), got {self.n!r}")
        if self.best_of is not None and (not _is_int(self.best_of) or self.best_of < self.n):
            raise ValueError(
                f"best_of must be None or an integer >= n={self.n} (completions to make), got {self.best_of!r}"
            )
        if self.best_of is not None and self.best_of > 1 and self.temperature == 0:
            raise ValueError("best_of > 1 needs sampling (temperature > 0): greedy completions are all the same")

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
            raise ValueError(
                f"repetition_penalty must be a number > 0 (1 turns it off), got {self.repetition_penalty!r}"
            )
        bias = self.logit_bias
        if bias is not None and not (
            isinstance(bias, dict)
            and all(_is_int(t) and t >= 0 and _is_number(b) and -100 <= b <= 100 for t, b in bias.items())
        ):
            raise ValueError(f"logit_bias must map token ids (integers >= 0) to biases in [-100, 100], got {bias!r}")

    def _check_stopping(self) -> None:
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(
                f"max_tokens must be an integer >= 1, or None for as many as the context holds, got {self.max_tokens!r}"
            )
        upper = math.inf if self.max_tokens is None else self.max_tokens
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= upper:
            raise ValueError(
                f"min_tokens must be an integer from 0 to max_tokens={self.max_tokens}, got {self.min_tokens!r}"
            )
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        self.stop = list(stop)
        ids = self.stop_token_ids or []
        if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be a list of token ids (integers >= 0), got {self.stop_token_ids!r}")
        self.stop_token_ids = list(ids)
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
