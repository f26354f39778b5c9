"""OpenAI request bodies and response objects, for /v1/completions and /v1/chat/completions."""

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict

from nanovllm.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk with the token counts."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    """Fields both endpoints share. Unknown fields are refused, so a typo is not silently ignored.

    The sampling fields are OpenAI's plus vLLM's extensions (top_k, min_p,
    repetition_penalty, min_tokens, stop_token_ids, include_stop_str_in_output,
    ignore_eos, skip_special_tokens); SamplingParams checks their values.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
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
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    n: int | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams from the fields the request set; ValueError names a bad value."""
        values = self.model_dump(include=_SAMPLING_FIELDS, exclude_none=True)
        values.setdefault("max_tokens", default_max_tokens)
        return SamplingParams.from_dict(values)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


_SAMPLING_FIELDS = set(_GenerationRequest.model_fields) - {"model", "stream", "stream_options", "user"}


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: a prompt as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]

    def single_prompt(self) -> str | list[int]:
        """The one prompt of the request; a batch of several is refused."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError(f"send one prompt per request, got a batch of {len(prompt)}")
            prompt = prompt[0]
        return prompt


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
    """POST /v1/chat/completions: messages rendered with the tokenizer's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        limit = self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        return super().sampling_params(default_max_tokens if limit is None else limit)


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


def completion_choice(text: str, finish_reason: str | None, chunk: bool, first: bool) -> dict:
    """One choice of /v1/completions: the same shape streamed or not."""
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def chat_choice(text: str, finish_reason: str | None, chunk: bool, first: bool) -> dict:
    """One choice of /v1/chat/completions: a `delta` when streamed (with the role first), else a `message`."""
    if not chunk:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish_reason}
    delta = {"role": "assistant", "content": text} if first else {"content": text}
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def error_body(message: str, error_type: str, code: int, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
