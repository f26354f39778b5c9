"""OpenAI request bodies and response pieces, for /v1/completions, /v1/chat/completions and /tokenize."""

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nanovllm.outputs import PositionLogprobs
from nanovllm.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk with the token counts."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    """Fields both endpoints share.

    The sampling fields are OpenAI's plus vLLM's extensions (top_k, min_p,
    repetition_penalty, min_tokens, stop_token_ids, include_stop_str_in_output,
    ignore_eos, skip_special_tokens); SamplingParams checks their values. A
    field this server does not know is ignored (the server logs it), as vLLM
    does; a known field with a bad value is refused.
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    n: int | None = None

    @property
    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def completion_limit(self) -> int | None:
        """The most tokens each completion may have, None for as many as the context holds."""
        return self.max_tokens

    def sampling_params(self, logprobs: int | None, prompt_logprobs: int | None = None,
                        best_of: int | None = None) -> SamplingParams:
        """The engine's SamplingParams from the fields the request set; ValueError names a bad value."""
        values = self.model_dump(include=_SAMPLING_FIELDS, exclude_none=True)
        values["max_tokens"] = self.completion_limit
        if self.logit_bias is not None:
            values["logit_bias"] = _token_biases(self.logit_bias)
        return SamplingParams(**values, logprobs=logprobs, prompt_logprobs=prompt_logprobs, best_of=best_of)


_SAMPLING_FIELDS = (set(_GenerationRequest.model_fields)
                    - {"model", "stream", "stream_options", "user", "max_tokens", "logit_bias"})


def _token_biases(logit_bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's {"token id": bias} with the ids as integers."""
    try:
        return {int(token_id): bias for token_id, bias in logit_bias.items()}
    except ValueError:
        raise ValueError(f"logit_bias keys must be token ids, got {sorted(logit_bias)[:5]}") from None


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: one prompt or a batch, each as text or token ids.

    `echo` puts the prompt before each completion's text (and, with `logprobs`,
    its tokens' log-probabilities before the completion's); `best_of`
    completions are made per prompt and the `n` most likely returned.
    """

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request: one, or each of a batch."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            return list(prompt)
        return [prompt]


class TextPart(BaseModel):
    """A text part of a message's content (the only kind a text model takes)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One turn of a conversation; content is a string or a list of text parts."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart]
    name: str | None = None

    def for_template(self) -> dict:
        """The message as chat templates expect it: content as one string."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        message = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions: messages rendered with the tokenizer's chat template.

    `max_completion_tokens` takes precedence over the older `max_tokens`, as
    OpenAI documents. `logprobs: true` reports the chosen tokens'
    log-probabilities, with `top_logprobs` alternatives each.
    `chat_template_kwargs`, `add_generation_prompt` and `continue_final_message`
    go to the template as vLLM passes them.
    """

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict]:
        return [m.for_template() for m in self.messages]


class TokenizeRequest(BaseModel):
    """POST /tokenize: a prompt, or messages to render with the chat template first."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None


class DetokenizeRequest(BaseModel):
    """POST /detokenize: token ids back to text."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


class Usage(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "Usage":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class ResponseHeader(BaseModel):
    """The fields every response and chunk of one request share."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> "ResponseHeader":
        return cls(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=model)

    def body(self, object_name: str, choices: list[dict], usage: Usage | None) -> dict:
        """A response or chunk object with these choices; `usage` may be None."""
        return {**self.model_dump(), "object": object_name, "choices": choices,
                "usage": usage.model_dump() if usage else None}


def completion_logprobs(token_ids: list[int], positions: list[PositionLogprobs | None], start_offset: int,
                        decode) -> dict:
    """The legacy completions `logprobs` object of these tokens: their text, log-probability, top
    alternatives and character offset (None entries: a first prompt token, which has none)."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = start_offset
    for token_id, position in zip(token_ids, positions):
        chosen = position[token_id] if position else None
        text = chosen.decoded_token if chosen else decode(token_id)
        tokens.append(text)
        token_logprobs.append(chosen.logprob if chosen else None)
        top_logprobs.append({lp.decoded_token: lp.logprob for lp in position.values()} if position else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}


def _token_entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(token_ids: list[int], positions: list[PositionLogprobs], top: int) -> dict:
    """The chat `logprobs` object: per token its text, log-probability and bytes, and the `top` most
    likely tokens at that position."""
    content = []
    for token_id, position in zip(token_ids, positions):
        chosen = position[token_id]
        best = sorted((lp for lp in position.values() if lp.rank <= top), key=lambda lp: lp.rank)
        content.append({**_token_entry(chosen.decoded_token, chosen.logprob),
                        "top_logprobs": [_token_entry(lp.decoded_token, lp.logprob) for lp in best]})
    return {"content": content}


def error_body(message: str, error_type: str, code: int, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
