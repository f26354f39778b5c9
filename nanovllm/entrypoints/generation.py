"""Serving /v1/completions and /v1/chat/completions: requests in, OpenAI responses or SSE streams out."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from nanovllm.engine.engine_client import EngineDeadError
from nanovllm.entrypoints.metrics import RequestTimer, ServerMetrics
from nanovllm.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseHeader,
    Usage,
    chat_logprobs,
    completion_logprobs,
    error_body,
    prompt_logprobs_json,
)
from nanovllm.entrypoints.reasoning import READS_SPECIAL_TOKENS, reasoning_stream
from nanovllm.entrypoints.server_settings import ServerSettings
from nanovllm.entrypoints.tool_call_formats import FORMATS, PartialCall
from nanovllm.entrypoints.tool_call_stream import ToolCallStream
from nanovllm.entrypoints.tool_calls import parse_tool_calls, partial_tool_calls, tool_choice_constraint
from nanovllm.frontend.chat import render_chat
from nanovllm.frontend.input_processor import ProcessedPrompt
from nanovllm.frontend.online_engine import OnlineEngine, RequestStream
from nanovllm.outputs import CompletionOutput, RequestOutput
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_FAILED = "the server failed while running this request"
_json = msgspec.json.Encoder()


class APIError(Exception):
    """An error answered in OpenAI's shape with its HTTP status; `code` (default: the status), `param`
    (the request field at fault) and `error_type` (default: by the status) as OpenAI sets them."""

    _TYPES = {401: "authentication_error", 404: "not_found_error", 503: "service_unavailable_error"}

    def __init__(
        self,
        status: int,
        message: str,
        code: int | str | None = None,
        param: str | None = None,
        error_type: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = status if code is None else code
        self.param = param
        self.error_type = error_type

    def response(self) -> JSONResponse:
        default = "invalid_request_error" if self.status < 500 else "server_error"
        error_type = self.error_type or self._TYPES.get(self.status, default)
        return JSONResponse(error_body(self.message, error_type, self.code, self.param), status_code=self.status)


@dataclass
class _Job:
    """One prompt of a request, its settings and, once queued, its stream."""

    prompt: ProcessedPrompt
    params: SamplingParams
    stream: RequestStream | None = None


@dataclass
class _Choice:
    """A completion as far as the response has it (whole, or a chunk's part of it when streamed);
    `started` says whether an earlier chunk of it went out."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    started: bool = False

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason

    def take(self) -> "_Choice":
        """What came since the last take (text held back meanwhile rides on the next chunk)."""
        part = _Choice(self.text, self.token_ids, self.logprobs, self.finish_reason, self.stop_reason, self.started)
        self.text, self.token_ids, self.logprobs, self.started = "", [], [], True
        return part


class GenerationHandler:
    """The request handling behind the two generation routes."""

    def __init__(self, engine: OnlineEngine, settings: ServerSettings, metrics: ServerMetrics):
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.info = engine.client.info
        self.tokenizer = engine.tokenizer
        self._template_renders_tools: bool | None = None  # the server's template, once a request showed it

    def check_model(self, name: str | None) -> None:
        """Refuse a model this server does not serve with OpenAI's 404 `model_not_found`; None (left
        out) means the served one."""
        if name is not None and name != self.settings.model_name:
            raise APIError(
                404,
                f"unknown model {name!r}: the model does not exist on this server, which serves "
                f"{self.settings.model_name!r}; send that name or leave model out",
                code="model_not_found",
                param="model",
                error_type="invalid_request_error",
            )

    def _check_request(self, body, n: int, best_of: int | None, logprobs: int | None) -> None:
        self.check_model(body.model)
        limit = self.settings.max_n
        for name, value in (("n", n), ("best_of", best_of)):
            if value is not None and value > limit:
                raise APIError(400, f"{name}={value} is above this server's limit of {limit} completions")
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", body.prompt_logprobs)):
            if value is not None and value > self.settings.max_logprobs:
                raise APIError(
                    400,
                    f"{name}: {value} logprob alternatives asked for; this server gives at most "
                    f"{self.settings.max_logprobs}",
                    param=name,
                )
        if body.prompt_logprobs is not None and body.stream:
            raise APIError(
                400, "prompt_logprobs are not available when streaming; send stream: false", param="prompt_logprobs"
            )

    def _check_context(self, prompt: ProcessedPrompt, limit: int | None) -> None:
        # a prompt that alone fills the context is refused later, with the engine's own message
        room = self.info.max_model_len
        if limit is not None and len(prompt.token_ids) < room < len(prompt.token_ids) + limit:
            raise APIError(
                400,
                f"this model's maximum context length is {room} tokens, but {len(prompt.token_ids)} "
                f"prompt tokens and {limit} completion tokens were asked for; lower max_tokens "
                f"or shorten the prompt",
            )

    def _within_context(self, prompt: ProcessedPrompt, params: SamplingParams) -> SamplingParams:
        """`params` whose default completion limit is cut to the room the prompt leaves (as vLLM does)."""
        room = self.info.max_model_len - len(prompt.token_ids)
        return replace(params, max_tokens=max(1, min(params.max_tokens, room)))

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        logprobs = body.logprobs
        self._check_request(body, body.n or 1, body.best_of, logprobs)
        if body.suffix is not None:
            raise APIError(
                400,
                "suffix is not supported: this server does not fill in the middle of a text; leave suffix out",
                param="suffix",
            )
        if body.stream and body.best_of is not None and body.best_of != (body.n or 1):
            raise APIError(
                400, "best_of must equal n (or be unset) when streaming: the best completions are only known at the end"
            )
        params = body.sampling_params(
            logprobs, body.prompt_logprobs_wanted(), body.best_of, defaults=self.engine.sampling_defaults
        )
        # tokenizing a long text takes a while: off the event loop, so that other streams go on
        prompts = await asyncio.to_thread(lambda: [self.engine.input_processor.parse(p) for p in body.prompts()])
        jobs = [
            _Job(prompt, params if body.max_tokens is not None else self._within_context(prompt, params))
            for prompt in prompts
        ]
        return await self._generate(jobs, body, request, _Completions(self, body))

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        top = body.top_logprobs
        if top is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true")
        self._check_request(body, body.n or 1, None, top)
        tool_choice = body.effective_tool_choice()
        tools = body.tool_list() if tool_choice != "none" else None
        prompt = await asyncio.to_thread(self._chat_prompt, body, tools, tool_choice)
        constraint = tool_choice_constraint(tools, tool_choice, not body.one_tool_call) if tools else None
        if constraint is not None and body.structured_spec() is not None:
            raise APIError(
                400,
                f"tool_choice {tool_choice!r} already constrains the reply; drop response_format and the guided fields",
            )
        params = body.sampling_params(
            (top or 0) if body.logprobs else None,
            body.prompt_logprobs,
            structured_outputs=constraint,
            defaults=self.engine.sampling_defaults,
        )
        if tool_choice == "auto" and tools and FORMATS[self.settings.tool_call_parser].keeps_special_tokens:
            params.skip_special_tokens = False  # the calls start with a special token ([TOOL_CALLS], <|python_tag|>)
        # a constrained reply is constrained from its first token: it holds no reasoning
        reasoning_parser = self.settings.reasoning_parser if params.structured_outputs is None else None
        if reasoning_parser in READS_SPECIAL_TOKENS:
            params.skip_special_tokens = False  # harmony's channels are special tokens
        shape = _Chat(self, body, tool_choice if tools else None, reasoning_parser)
        return await self._generate([_Job(prompt, params)], body, request, shape)

    def _chat_prompt(self, body: ChatCompletionRequest, tools: list | None, tool_choice) -> ProcessedPrompt:
        template = body.chat_template or self.settings.chat_template
        text = self._render(body, template, tools)
        if tool_choice == "auto" and body.chat_template is None and self._template_renders_tools is None:
            self._template_renders_tools = self._render(body, template, None) != text
            if not self._template_renders_tools:
                logger.warning(
                    "tool_choice 'auto': the chat template does not show the tools to the model, so it "
                    "will hardly ever call one; serve a template that renders tools (--chat-template)"
                )
        # the rendered template already holds the special tokens the model expects
        return ProcessedPrompt(text, self.engine.input_processor.tokenize(text, add_special_tokens=False))

    def _render(self, body: ChatCompletionRequest, template: str | None, tools: list | None) -> str:
        return render_chat(
            self.tokenizer,
            body.conversation(),
            body.add_generation_prompt,
            body.continue_final_message,
            chat_template=template,
            chat_template_kwargs=body.template_kwargs(),
            tools=tools,
        )

    async def _generate(self, jobs: list[_Job], body, request: Request, shape: "_Shape") -> Response:
        completions = sum(job.params.num_completions for job in jobs)
        if completions > self.settings.max_waiting:
            raise APIError(
                400,
                f"this request makes {completions} completions (prompts times n or best_of); this "
                f"server queues at most {self.settings.max_waiting}: split it",
            )
        for job in jobs:  # every prompt is checked, once, before any runs
            self._check_context(job.prompt, job.params.max_tokens)
            job.prompt, job.params = self.engine.check(job.prompt, job.params)
        if self.engine.stats().num_waiting >= self.settings.max_waiting:
            raise APIError(
                503, f"the server is busy ({self.settings.max_waiting} requests already waiting); retry later"
            )
        try:
            for job in jobs:
                job.stream = self.engine.add_checked(job.prompt, job.params)
        except EngineDeadError as e:
            for job in jobs:
                if job.stream is not None:
                    self.engine.abort(job.stream.request_id)
            raise APIError(503, f"the engine is not running ({e}); retry against a healthy server") from None
        if body.stream:
            return StreamingResponse(
                self._events(jobs, shape, body.include_usage, body.continuous_usage), media_type="text/event-stream"
            )
        return await _cancel_on_disconnect(request, self._complete(jobs, shape))

    async def _outputs(self, job: _Job) -> AsyncIterator[list[RequestOutput]]:
        """The job's outputs, as many at a time as have arrived; its request is cancelled if the reader
        stops before the end."""
        timer = RequestTimer(self.metrics, len(job.prompt.token_ids))
        finished = False
        try:
            async for batch in job.stream.batches():
                timer.observe(batch)
                finished = batch[-1].finished
                yield batch
        finally:
            if not finished:
                self.engine.abort(job.stream.request_id)
                timer.finish("abort")

    async def _merged(self, jobs: list[_Job]) -> AsyncIterator[list[tuple[int, RequestOutput]]]:
        """(job index, output) from every job's stream, as many at a time as have arrived: a server
        that falls behind the engine sends one chunk for several steps rather than falling further."""
        if len(jobs) == 1:
            async for batch in self._outputs(jobs[0]):
                yield [(0, output) for output in batch]
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, job: _Job) -> None:
            async for batch in self._outputs(job):
                for output in batch:
                    queue.put_nowait((index, output))
            queue.put_nowait((index, None))

        tasks = [asyncio.ensure_future(pump(i, job)) for i, job in enumerate(jobs)]
        try:
            remaining = len(jobs)
            while remaining:
                arrived = [await queue.get()]
                while not queue.empty():
                    arrived.append(queue.get_nowait())
                remaining -= sum(output is None for _, output in arrived)
                batch = [(index, output) for index, output in arrived if output is not None]
                if batch:
                    yield batch
        finally:
            for task in tasks:
                task.cancel()

    async def _complete(self, jobs: list[_Job], shape: "_Shape") -> Response:
        choices: dict[tuple[int, int], _Choice] = {}
        prompt_logprobs: dict[int, list] = {}
        async with contextlib.aclosing(self._merged(jobs)) as batches:
            async for batch in batches:
                for index, output in batch:
                    if output.prompt_logprobs is not None:
                        prompt_logprobs[index] = output.prompt_logprobs
                    for delta in map(shape.shown, output.outputs):
                        choices.setdefault((index, delta.index), _Choice()).add(delta)
        if any(choice.finish_reason == "error" for choice in choices.values()):
            return self._failure(jobs).response()
        bodies = [
            shape.choice(jobs[i], i, k, choice, prompt_logprobs.get(i), final=True)
            for (i, k), choice in sorted(choices.items())
        ]
        usage = Usage.of(
            sum(len(job.prompt.token_ids) for job in jobs), sum(len(choice.token_ids) for choice in choices.values())
        )
        return JSONResponse(
            {**shape.header.body(shape.object_name, bodies, usage), **shape.response_fields(prompt_logprobs)}
        )

    def _failure(self, jobs: list[_Job]) -> APIError:
        """The error of a request that the engine ended with finish_reason "error": 503 when the server
        is going away (shutting down, or its core died), else 500."""
        message = next((job.stream.error for job in jobs if job.stream.error), _FAILED)
        return APIError(500 if self.engine.healthy else 503, message)

    async def _events(
        self, jobs: list[_Job], shape: "_Shape", include_usage: bool, continuous_usage: bool
    ) -> AsyncIterator[bytes]:
        """The response as server-sent events; with `include_usage` a last chunk carries the token counts,
        with `continuous_usage` every chunk the counts so far too. A fault ends the stream with an error
        event, never a cut connection."""
        try:
            async with contextlib.aclosing(self._chunks(jobs, shape, include_usage, continuous_usage)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except APIError as e:
            yield _sse(error_body(e.message, "server_error", e.status))
        except Exception:
            logger.exception("streaming a response failed")
            yield _sse(error_body(_FAILED, "server_error", 500))

    async def _chunks(
        self, jobs: list[_Job], shape: "_Shape", include_usage: bool, continuous_usage: bool
    ) -> AsyncIterator[bytes]:
        pending: dict[tuple[int, int], _Choice] = {}
        prompt_logprobs: dict[int, list] = {}
        num_prompt_tokens = sum(len(job.prompt.token_ids) for job in jobs)
        num_completion_tokens = 0
        async with contextlib.aclosing(self._merged(jobs)) as batches:
            async for batch in batches:
                changed: dict[tuple[int, int], _Choice] = {}
                for index, output in batch:
                    if output.prompt_logprobs is not None:
                        prompt_logprobs[index] = output.prompt_logprobs
                    for delta in map(shape.shown, output.outputs):
                        if delta.finish_reason == "error":
                            raise self._failure(jobs)
                        choice = pending.setdefault((index, delta.index), _Choice())
                        choice.add(delta)
                        num_completion_tokens += len(delta.token_ids)
                        if delta.text or delta.finished():
                            changed[index, delta.index] = choice
                usage = Usage.of(num_prompt_tokens, num_completion_tokens) if continuous_usage else None
                for (index, k), choice in changed.items():
                    body = shape.choice(jobs[index], index, k, choice.take(), prompt_logprobs.get(index), final=False)
                    yield _sse(shape.header.body(shape.chunk_object_name, [body], usage))
        if include_usage:
            usage = Usage.of(num_prompt_tokens, num_completion_tokens)
            yield _sse(shape.header.body(shape.chunk_object_name, [], usage))
        yield b"data: [DONE]\n\n"


class _Shape:
    """How one endpoint lays out its choices."""

    object_name: str
    chunk_object_name: str

    def choice(self, job: _Job, prompt_index: int, index: int, choice: _Choice, prompt_logprobs, final: bool) -> dict:
        raise NotImplementedError

    def shown(self, delta: CompletionOutput) -> CompletionOutput:
        """What of a completion's delta the response shows (all of it, unless a shape says otherwise)."""
        return delta

    def response_fields(self, prompt_logprobs: dict[int, list]) -> dict:
        """Fields a whole response carries beside its choices, given the prompt log-probabilities by
        prompt index."""
        return {}


class _Completions(_Shape):
    """/v1/completions: choice `index` of prompt p is numbered p * n + index; `echo` puts the prompt
    first; `logprobs` in the legacy shape, offsets into the choice's text; each choice carries
    `prompt_logprobs` (vLLM's) when asked for. A request that only scores its prompt shows none of
    the one token generated for it."""

    object_name = chunk_object_name = "text_completion"

    def __init__(self, handler: GenerationHandler, body: CompletionRequest):
        self.handler = handler
        self.body = body
        self.n = body.n or 1
        self.header = ResponseHeader.new("cmpl", handler.settings.model_name)
        self._sent_chars: dict[tuple[int, int], int] = {}

    def _decode(self, token_id: int) -> str:
        tokenizer = self.handler.tokenizer
        return "" if tokenizer is None else tokenizer.decode([token_id])

    def _prompt_text(self, job: _Job) -> str:
        if job.prompt.text is not None:
            return job.prompt.text
        tokenizer = self.handler.tokenizer
        return "" if tokenizer is None else tokenizer.decode(job.prompt.token_ids)

    def choice(self, job: _Job, prompt_index: int, index: int, choice: _Choice, prompt_logprobs, final: bool) -> dict:
        key = (prompt_index, index)
        echo = self.body.echo and not choice.started
        prompt_text = self._prompt_text(job) if echo else ""
        text = prompt_text + choice.text
        logprobs = None
        if self.body.logprobs is not None:
            offset = self._sent_chars.get(key, 0)
            logprobs = completion_logprobs(choice.token_ids, choice.logprobs, offset + len(prompt_text), self._decode)
            if echo and prompt_logprobs is not None:
                echoed = completion_logprobs(job.prompt.token_ids, prompt_logprobs, offset, self._decode)
                logprobs = {name: echoed[name] + values for name, values in logprobs.items()}
        self._sent_chars[key] = self._sent_chars.get(key, 0) + len(text)
        body = {
            "index": prompt_index * self.n + index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }
        if self.body.prompt_logprobs is not None:
            body["prompt_logprobs"] = None if prompt_logprobs is None else prompt_logprobs_json(prompt_logprobs)
        return body

    def shown(self, delta: CompletionOutput) -> CompletionOutput:
        if not self.body.scores_prompt:
            return delta
        # the prompt was scored once the limit of 0 generated tokens was reached
        finish_reason = "length" if delta.finish_reason in ("stop", "length") else delta.finish_reason
        return CompletionOutput(delta.index, "", [], None, [], finish_reason)


class _Chat(_Shape):
    """/v1/chat/completions: a `message` when whole, a `delta` (the role first) when streamed.

    With tools (`tool_choice` not "none") the reply's calls become `tool_calls`
    (finish_reason "tool_calls", or "length" for a forced call cut short, whose
    arguments go as far as they got). Streamed, "auto" text goes out as content
    only up to a call's start, and each call as it is written: its name once
    whole, then its arguments in pieces (`ToolCallStream`), a forced call's too.
    `prompt_logprobs` (vLLM's) sit beside the choices.

    With a `reasoning_parser` the reply's reasoning goes in `reasoning_content`
    (streamed: in deltas of its own) and only its answer is content, where
    tool calls are looked for.
    """

    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(
        self,
        handler: GenerationHandler,
        body: ChatCompletionRequest,
        tool_choice: str | dict | None,
        reasoning_parser: str | None = None,
    ):
        self.body = body
        self.tool_choice = tool_choice
        self.tool_format = FORMATS[handler.settings.tool_call_parser]
        self.reasoning_parser = reasoning_parser
        self.tokenizer = handler.tokenizer  # harmony replies are read by token ids where its vocabulary allows
        self._reasoning: dict = {}  # per choice: its split (`reasoning_stream`), with a reasoning parser
        self.header = ResponseHeader.new("chatcmpl", handler.settings.model_name)
        self._text: dict[int, str] = {}  # per choice: the text so far, when tools are on
        self._shown: dict[int, int] = {}  # per choice: how much of it went out as content
        self._call_streams: dict[int, ToolCallStream] = {}  # per streamed choice: the calls sent so far

    def choice(self, job: _Job, prompt_index: int, index: int, choice: _Choice, prompt_logprobs, final: bool) -> dict:
        logprobs = None
        if self.body.logprobs:
            logprobs = chat_logprobs(choice.token_ids, choice.logprobs, self.body.top_logprobs or 0)
        body = {
            "index": index,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }
        reasoning, answer = self._split(index, choice)
        if self.tool_choice is None:
            message = {"content": answer}
        else:
            message, called = self._tool_message(index, answer, choice.finish_reason, final)
            if called and choice.finish_reason == "stop":
                body["finish_reason"] = "tool_calls"
        if self.reasoning_parser is not None:
            message = _with_reasoning(message, reasoning, final)
        if final:
            return {**body, "message": {"role": "assistant", **message}}
        return {**body, "delta": message if choice.started else {"role": "assistant", **message}}

    def _split(self, index: int, choice: _Choice) -> tuple[str, str]:
        """The reasoning and the answer text that `choice` brings (no reasoning without a parser)."""
        if self.reasoning_parser is None:
            return "", choice.text
        if index not in self._reasoning:
            self._reasoning[index] = reasoning_stream(self.reasoning_parser, self.tokenizer)
        stream = self._reasoning[index]
        reasoning, answer = stream.feed(choice.text, choice.token_ids)
        if choice.finish_reason is not None:
            rest_reasoning, rest_answer = stream.finish()
            reasoning, answer = reasoning + rest_reasoning, answer + rest_answer
        return reasoning, answer

    def _tool_message(self, index: int, answer: str, finish_reason: str | None, final: bool) -> tuple[dict, bool]:
        """Content and tool calls of a reply that may call tools, given its answer text (new since the last
        chunk, when streamed), and whether the reply holds calls. Whole, the calls come once the reply ends;
        streamed, as they are written (`ToolCallStream`), and content up to where they start."""
        text = self._text[index] = self._text.get(index, "") + answer
        if finish_reason is None:
            return self._with_call_deltas(index, {"content": self._showable(index, text)}, self._partial(text)), False
        content, calls = parse_tool_calls(
            text,
            self.tool_choice,
            cut=finish_reason == "length",
            parallel=not self.body.one_tool_call,
            fmt=self.tool_format,
            tools=self.body.tool_list() or [],
        )
        shown = self._shown.get(index, 0)
        if not calls:
            return {"content": text[shown:]}, False
        rest = (content or "")[shown:] if content and content.startswith(text[:shown]) else None
        if final:
            return {"content": rest or None, "tool_calls": [call.as_openai() for call in calls]}, True
        whole = [PartialCall(call.name, call.arguments) for call in calls]
        return self._with_call_deltas(index, {"content": rest or None}, whole), True

    def _partial(self, text: str) -> list[PartialCall]:
        """The calls a streamed reply so far has begun."""
        return partial_tool_calls(
            text, self.tool_choice, not self.body.one_tool_call, self.tool_format, self.body.tool_list() or []
        )

    def _with_call_deltas(self, index: int, message: dict, calls: list[PartialCall]) -> dict:
        """`message` with the `tool_calls` deltas that `calls` bring to the choice's stream, if any."""
        stream = self._call_streams.setdefault(index, ToolCallStream(self.tool_format.new_call_id))
        entries = stream.deltas(calls)
        return {**message, "tool_calls": entries} if entries else message

    def _showable(self, index: int, text: str) -> str:
        """New content that is surely no tool call: none for a forced call, and for "auto" the text
        before the calls start (`ToolCallFormat.content_end`)."""
        if self.tool_choice != "auto":
            return ""
        end = self.tool_format.content_end(text)
        shown = self._shown.get(index, 0)
        self._shown[index] = max(shown, end)
        return text[shown:end]

    def response_fields(self, prompt_logprobs: dict[int, list]) -> dict:
        if self.body.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": prompt_logprobs_json(prompt_logprobs[0]) if 0 in prompt_logprobs else None}


def _with_reasoning(message: dict, reasoning: str, final: bool) -> dict:
    """`message` with its reasoning: whole, `reasoning_content` and `content` (each null when empty);
    streamed, `reasoning_content` in a delta that brings some, beside content only where that
    brings some too."""
    if final:
        return {"reasoning_content": reasoning or None, **message, "content": message["content"] or None}
    if not reasoning:
        return message
    return {"reasoning_content": reasoning, **{k: v for k, v in message.items() if v or k != "content"}}


def _sse(payload: dict) -> bytes:
    """One server-sent event carrying `payload` as JSON (UTF-8, not escaped to ASCII)."""
    return b"data: " + _json.encode(payload) + b"\n\n"


async def _cancel_on_disconnect(request: Request, work) -> Response:
    """Await `work`, cancelling it (and so its requests) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return Response(status_code=499)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
