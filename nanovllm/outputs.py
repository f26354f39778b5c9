"""What generation returns, in vLLM's shapes: a RequestOutput per prompt, a CompletionOutput per completion."""

from dataclasses import dataclass

import msgspec


class Logprob(msgspec.Struct, gc=False):
    """A token's log-probability from the raw logits, its rank over the vocabulary (1 = the most likely)
    and its text (None without a tokenizer).

    A request with logprobs=k holds 1 + k of these per completion token: hundreds of thousands in a
    batch. They hold only numbers and text, so they are kept out of the cycle collector's reach
    (gc=False), and so are the position dicts that hold only them: otherwise every full pass of the
    collector would walk all of them again, which costs more host time than building them.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# per position: {token id: Logprob} for the chosen (or actual) token and the top alternatives
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One completion of a prompt.

    `finish_reason` is "stop", "length", "abort" or "error" once it ended, else
    None; `stop_reason` is the stop string or stop token id that ended it (None
    for an end-of-sequence token or a length limit). `cumulative_logprob` sums
    the chosen tokens' log-probabilities when they were computed (logprobs
    asked for, or best_of ranking), else None. In a streamed output, `text`,
    `token_ids` and `logprobs` hold only what is new since the previous one.
    `reasoning_content` is the reasoning that `LLM.chat` with a `reasoning_parser` split from `text`
    (None otherwise, or when the reply has none).
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    reasoning_content: str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A prompt and its completions.

    `prompt` is the text when the prompt was given as text, else None;
    `prompt_logprobs` has None for the first prompt token and one entry per
    later one, when asked for. `num_cached_tokens` counts prompt tokens the
    prefix cache supplied.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
