"""OpenAI request bodies and response pieces, for /v1/completions, /v1/chat/completions and /tokenize."""

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nanovllm.frontend.input_processor import check_unicode
from nanovllm.outputs import PositionLogprobs
from nanovllm.sampling_params import SamplingParams, StructuredOutputsParams

logger = logging.getLogger(__name__)

# what /v1/completions generates when the request leaves max_tokens out (OpenAI's and vLLM's default)
DEFAULT_COMPLETION_TOKENS = 16
# Every step checks each live request's stop strings and stop tokens: a request may bring only so many.
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024


class _Lenient(BaseModel):
    """A part of a request body that keeps the fields it does not know aside (in `model_extra`) rather
    than refusing them: clients send back what OpenAI's library gives them, extra fields included."""

    model_config = ConfigDict(extra="allow")


def _unknown_paths(value, path: str = "") -> Iterator[str]:
    """The dotted paths (`messages.0.refusal`) of the fields `value` and its parts did not know."""
    if isinstance(value, BaseModel):
        for name in value.model_extra or {}:
            yield path + name
        for name in type(value).model_fields:
            yield from _unknown_paths(getattr(value, name), f"{path}{name}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unknown_paths(item, f"{path}{index}.")


class _RequestBody(_Lenient):
    """A whole request body: once parsed, the fields it ignores are logged in one warning."""

    @model_validator(mode="after")
    def _warn_about_unknown_fields(self):
        unknown = self.unknown_fields
        if unknown:
            logger.warning("%s: ignoring unknown field(s) %s", type(self).__name__, ", ".join(unknown))
        return self

    @property
    def unknown_fields(self) -> list[str]:
        """The dotted paths of the fields the body holds but this server does not know."""
        return list(_unknown_paths(self))


class StreamOptions(_Lenient):
    """`stream_options`: `include_usage` adds a last chunk with the token counts, and
    `continuous_usage_stats` (vLLM's) the counts so far to every chunk too."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Lenient):
    """`response_format.json_schema`: the schema the reply must follow (always strictly)."""

    model_config = ConfigDict(populate_by_name=True)
    name: str = "response"
    description: str | None = None
    json_schema: dict = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    """`response_format`: plain text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _GenerationRequest(_RequestBody):
    """Fields both endpoints share.

    The sampling fields are OpenAI's plus vLLM's extensions (top_k, min_p,
    repetition_penalty, min_tokens, stop_token_ids, include_stop_str_in_output,
    ignore_eos, skip_special_tokens); SamplingParams checks their values. A
    field this server does not know is ignored (the server logs it), as vLLM
    does, at any depth; a known field with a bad value is refused. `model` may
    be left out (the served model). `prompt_logprobs` (vLLM's) gives the
    prompt tokens' log-probabilities, not when streaming. The reply may be
    constrained by one of `response_format`, vLLM's `structured_outputs`
    ({"json" | "regex" | "choice" | "grammar" | "json_object": ...}) or its
    older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`.
    """

    model_config = ConfigDict(allow_inf_nan=False)
    model: str | None = None
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
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[int], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    n: int | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    prompt_logprobs: int | None = None

    def structured_spec(self) -> StructuredOutputsParams | None:
        """The constraint the request asks for, if any; ValueError if it asks for more than one."""
        specs = {}
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            specs["response_format"] = StructuredOutputsParams(json_object=True)
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None:
                raise ValueError("response_format of type json_schema needs a json_schema with a schema")
            specs["response_format"] = StructuredOutputsParams(json=fmt.json_schema.json_schema)
        if self.structured_outputs is not None:
            unknown = sorted(set(self.structured_outputs) - _STRUCTURED_KEYS)
            if unknown:
                raise ValueError(
                    f"structured_outputs takes {', '.join(sorted(_STRUCTURED_KEYS))}; unknown: {', '.join(unknown)}"
                )
            specs["structured_outputs"] = StructuredOutputsParams(**self.structured_outputs)
        for name in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{name}")
            if value is not None:
                specs[f"guided_{name}"] = StructuredOutputsParams(**{name: value})
        if len(specs) > 1:
            raise ValueError(f"send one constraint on the output, got {', '.join(specs)}")
        return next(iter(specs.values()), None)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Whether every streamed chunk carries the token counts so far."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    @property
    def completion_limit(self) -> int | None:
        """The most tokens each completion may have, None for as many as the context holds."""
        return self.max_tokens

    def sampling_params(
        self,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        best_of: int | None = None,
        structured_outputs: StructuredOutputsParams | None = None,
        defaults: dict | None = None,
    ) -> SamplingParams:
        """The engine's SamplingParams from the fields the request set, `defaults` (the model's generation
        config) for those it left out; ValueError names a bad value. `structured_outputs` replaces what the
        request's own fields ask for."""
        values = {**(defaults or {}), **self.model_dump(include=_SAMPLING_FIELDS, exclude_none=True)}
        for stop in [values["stop"]] if isinstance(values.get("stop"), str) else values.get("stop", []):
            check_unicode(stop, "a stop string")
        values["max_tokens"] = self.completion_limit
        if self.logit_bias is not None:
            values["logit_bias"] = _token_biases(self.logit_bias)
        return SamplingParams(
            **values,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            best_of=best_of,
            structured_outputs=structured_outputs or self.structured_spec(),
        )


_STRUCTURED_KEYS = {"json", "regex", "choice", "grammar", "json_object"}
_SAMPLING_FIELDS = set(_GenerationRequest.model_fields) - {
    "model",
    "stream",
    "stream_options",
    "user",
    "max_tokens",
    "logit_bias",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "prompt_logprobs",
}


def _token_biases(logit_bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's {"token id": bias} with the ids as integers."""
    try:
        return {int(token_id): bias for token_id, bias in logit_bias.items()}
    except ValueError:
        raise ValueError(f"logit_bias keys must be token ids, got {sorted(logit_bias)[:5]}") from None


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: one prompt or a batch, each as text or token ids.

    `max_tokens` left out (or null) is 16, as OpenAI and vLLM have it. `echo`
    puts the prompt before each completion's text (and, with `logprobs`, its
    tokens' log-probabilities before the completion's); with `max_tokens: 0`
    it only scores the prompt: the prompt comes back, nothing is generated.
    `best_of` completions are made per prompt and the `n` most likely
    returned. `suffix` is known only to be refused: no model here fills in a
    middle.
    """

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @property
    def scores_prompt(self) -> bool:
        """Whether the request only scores its prompt (`echo` with `max_tokens: 0`)."""
        return self.echo and self.max_tokens == 0

    @property
    def completion_limit(self) -> int:
        """The most tokens each completion may have: as sent, else 16; a prompt being scored is given
        one token (the engine makes at least one) that the response leaves out."""
        if self.scores_prompt:
            return 1
        return DEFAULT_COMPLETION_TOKENS if self.max_tokens is None else self.max_tokens

    def prompt_logprobs_wanted(self) -> int | None:
        """How many alternatives each prompt token's log-probabilities carry: `prompt_logprobs`, else
        `logprobs` when the prompt is echoed, else None (none computed)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request: one, or each of a batch."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            return list(prompt)
        return [prompt]


class TextPart(_Lenient):
    """A text part of a message's content (the only kind a text model takes)."""

    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data):
        if isinstance(data, dict) and data.get("type") != "text":
            raise ValueError(
                f"this model takes text content parts only, not {data.get('type')!r}; send "
                f'{{"type": "text", "text": ...}}'
            )
        return data


class FunctionCall(_Lenient):
    """A function and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCallMessage(_Lenient):
    """A call an assistant message made, sent back in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    """One turn of a conversation: content as a string or text parts; an assistant turn may carry the tool
    calls it made (then content may be null), a tool turn the id of the call it answers."""

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallMessage] | None = None
    tool_call_id: str | None = None

    def for_template(self) -> dict:
        """The message as render_chat takes it: content as a string or text parts, tool call arguments as
        objects."""
        if self.content is None and not self.tool_calls:
            raise ValueError(f"a {self.role} message needs content (only an assistant's tool calls may stand alone)")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        # text parts go to render_chat as parts, which joins them as LLM.chat does
        content = (
            self.content
            if isinstance(self.content, str | None)
            else [{"type": "text", "text": part.text} for part in self.content]
        )
        message = {"role": self.role, "content": content or ""}
        for name in ("name", "tool_call_id"):
            if getattr(self, name) is not None:
                message[name] = getattr(self, name)
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
                }
                for call in self.tool_calls
            ]
        return message


def _arguments(text: str):
    """Arguments as the object templates render (the JSON text when it is not JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class FunctionDefinition(_Lenient):
    """A function the model may call: its name, what it does, its parameters' JSON schema."""

    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


_FUNCTION_FIELDS = set(FunctionDefinition.model_fields)


class ToolDefinition(_Lenient):
    """`tools[i]`: a function."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Lenient):
    """The function a named tool_choice calls."""

    name: str


class NamedToolChoice(_Lenient):
    """`tool_choice` naming the function the reply must call."""

    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions: messages rendered with a chat template (`chat_template`, vLLM's: this
    request's own, else the server's, else the tokenizer's).

    `max_completion_tokens` takes precedence over the older `max_tokens`, as
    OpenAI documents. `logprobs: true` reports the chosen tokens'
    log-probabilities, with `top_logprobs` alternatives each.
    `chat_template_kwargs`, `add_generation_prompt` and `continue_final_message`
    go to the template as vLLM passes them; `reasoning_effort` goes to it as the
    template variable of that name (gpt-oss's writes it into the system message),
    unless `chat_template_kwargs` sets that variable itself. `parallel_tool_calls:
    false` allows at most one tool call in the reply.
    """

    messages: list[ChatMessage]
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None

    def template_kwargs(self) -> dict | None:
        """The chat template's variables beyond the messages: `chat_template_kwargs`, with `reasoning_effort`
        as a variable of its own where set (and not set there)."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict]:
        return [m.for_template() for m in self.messages]

    def tool_list(self) -> list[dict] | None:
        """The tools as chat templates and the constraint take them (None without tools)."""
        if not self.tools:
            return None
        return [
            {"type": "function", "function": t.function.model_dump(exclude_none=True, include=_FUNCTION_FIELDS)}
            for t in self.tools
        ]

    def effective_tool_choice(self) -> str | dict:
        """The tool choice in force: as sent, else "auto" when tools are given and "none" without."""
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        if self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools; send the functions the model may call in tools")
        if isinstance(self.tool_choice, str):
            return self.tool_choice
        return {"type": "function", "function": {"name": self.tool_choice.function.name}}

    @property
    def one_tool_call(self) -> bool:
        """Whether the reply may call at most one tool (`parallel_tool_calls: false`)."""
        return self.parallel_tool_calls is False


class TokenizeRequest(_RequestBody):
    """POST /tokenize: a prompt, or messages to render with the chat template first (`chat_template`:
    this request's own)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict | None = None


class DetokenizeRequest(_RequestBody):
    """POST /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


class Usage(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "Usage":
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


@dataclass(frozen=True)
class ResponseHeader:
    """The fields every response and chunk of one request share."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> "ResponseHeader":
        return cls(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=model)

    def body(self, object_name: str, choices: list[dict], usage: Usage | None) -> dict:
        """A response or chunk object with these choices; `usage` may be None."""
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage.model_dump() if usage else None,
        }


def completion_logprobs(
    token_ids: list[int], positions: list[PositionLogprobs | None], start_offset: int, decode
) -> dict:
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
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def _token_entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(token_ids: list[int], positions: list[PositionLogprobs], top: int) -> dict:
    """The chat `logprobs` object: per token its text, log-probability and bytes, and the `top` most
    likely tokens at that position."""
    content = []
    for token_id, position in zip(token_ids, positions):
        chosen = position[token_id]
        best = sorted((lp for lp in position.values() if lp.rank <= top), key=lambda lp: lp.rank)
        content.append(
            {
                **_token_entry(chosen.decoded_token, chosen.logprob),
                "top_logprobs": [_token_entry(lp.decoded_token, lp.logprob) for lp in best],
            }
        )
    return {"content": content}


def prompt_logprobs_json(positions: list[PositionLogprobs | None]) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then per position {token id as text:
    {"logprob", "rank", "decoded_token"}} for the prompt's token and the top alternatives."""
    return [
        None
        if position is None
        else {
            str(token_id): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
            for token_id, lp in position.items()
        }
        for position in positions
    ]


def error_body(message: str, error_type: str, code: int | str, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
