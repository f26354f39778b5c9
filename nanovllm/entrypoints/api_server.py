"""An OpenAI-compatible HTTP server (FastAPI) on top of the online engine."""

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import jinja2
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from nanovllm.frontend.online_engine import OnlineEngine, RequestStream
from nanovllm.entrypoints.metrics import RequestTimer, ServerMetrics
from nanovllm.entrypoints.protocol import (ChatCompletionRequest, CompletionRequest, ResponseHeader, Usage,
                                           chat_choice, completion_choice, error_body)

logger = logging.getLogger(__name__)

# OpenAI's completions endpoint generates 16 tokens unless told otherwise.
_DEFAULT_COMPLETION_TOKENS = 16


class APIError(Exception):
    """An error answered in OpenAI's shape with its HTTP status."""

    _TYPES = {401: "authentication_error", 404: "not_found_error", 503: "service_unavailable_error"}

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> JSONResponse:
        default = "invalid_request_error" if self.status < 500 else "server_error"
        error_type = self._TYPES.get(self.status, default)
        return JSONResponse(error_body(self.message, error_type, self.status), status_code=self.status)


@dataclass(frozen=True)
class _Endpoint:
    """What differs between /v1/completions and /v1/chat/completions."""

    id_prefix: str
    object_name: str
    chunk_object_name: str
    choice: Callable[[str, str | None, bool, bool], dict]


_COMPLETIONS = _Endpoint("cmpl", "text_completion", "text_completion", completion_choice)
_CHAT = _Endpoint("chatcmpl", "chat.completion", "chat.completion.chunk", chat_choice)


@dataclass(frozen=True)
class ServerSettings:
    """How the server answers: the model's public name, the API key, the waiting-queue limit."""

    model_name: str
    api_key: str | None = None
    max_waiting: int = 1024

    def __post_init__(self) -> None:
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1 (requests allowed to wait), got {self.max_waiting}")


def build_app(engine: OnlineEngine, settings: ServerSettings) -> FastAPI:
    """The FastAPI application serving `engine` under `settings.model_name`; it shuts the engine down
    when the server stops."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        engine.shutdown()

    app = FastAPI(title="nanovllm", lifespan=lifespan)
    server = _Server(engine, settings)
    _add_error_handlers(app)

    async def require_api_key(request: Request) -> None:
        if settings.api_key is None:
            return
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {settings.api_key}".encode()):
            raise APIError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'")

    # every endpoint but /health
    guarded = [Depends(require_api_key)]

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict:
        return server.models()

    @app.get("/metrics", dependencies=guarded)
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        server.check_model(body.model)
        prompt_ids = server.tokenize(body.single_prompt())
        return await server.generate(body, prompt_ids, _DEFAULT_COMPLETION_TOKENS, _COMPLETIONS, request)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        server.check_model(body.model)
        prompt_ids = server.render_chat(body)
        return await server.generate(body, prompt_ids, server.room_after(prompt_ids), _CHAT, request)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error while handling %s", request.url.path)
        return APIError(500, "internal server error").response()

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, error: ValueError) -> JSONResponse:
        # The engine and the request models raise ValueError for what the user must change.
        return APIError(400, str(error)).response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        return APIError(400, _describe_validation_errors(error)).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return APIError(error.status_code, str(error.detail)).response()


def _describe_validation_errors(error: RequestValidationError) -> str:
    problems = []
    for e in error.errors()[:5]:
        if e.get("type") == "json_invalid":
            return f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'parse error')})"
        where = ".".join(str(part) for part in e.get("loc", ()) if part != "body")
        problems.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "invalid request: " + "; ".join(problems)


class _Server:
    """The request handling behind the routes."""

    def __init__(self, engine: OnlineEngine, settings: ServerSettings):
        self.engine = engine
        self.settings = settings
        self.info = engine.client.info
        self.tokenizer = engine.tokenizer
        self.tokenize = engine.input_processor.tokenize
        self.metrics = ServerMetrics(engine, settings.model_name)

    def models(self) -> dict:
        card = {"id": self.settings.model_name, "object": "model", "created": 0, "owned_by": "nanovllm",
                "max_model_len": self.info.max_model_len}
        return {"object": "list", "data": [card]}

    def check_model(self, name: str) -> None:
        if name != self.settings.model_name:
            raise APIError(400, f"unknown model {name!r}; this server serves {self.settings.model_name!r}")

    def render_chat(self, body: ChatCompletionRequest) -> list[int]:
        """The conversation in the tokenizer's chat template, as token ids, ready for the reply."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions")
        messages = [m.for_template() for m in body.messages]
        if not messages:
            raise APIError(400, "messages is empty; send at least one message")
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except jinja2.TemplateError as e:
            raise APIError(400, f"the model's chat template refused these messages: {e}") from None
        # The template already holds any special tokens the model expects.
        return self.tokenize(self.tokenizer.encode(text, add_special_tokens=False))

    def room_after(self, prompt_ids: list[int]) -> int:
        """The default length of a chat reply: whatever the context and the KV cache leave."""
        limit = min(self.info.max_model_len, self.info.num_kvcache_blocks * self.info.block_size)
        return max(1, limit - len(prompt_ids))

    async def generate(self, body, prompt_ids: list[int], default_max_tokens: int, endpoint: _Endpoint,
                       request: Request) -> Response:
        """Queue the request, then stream its chunks or answer once it is done."""
        params = body.sampling_params(default_max_tokens)
        if self.engine.stats().num_waiting >= self.settings.max_waiting:
            raise APIError(503, f"the server is busy ({self.settings.max_waiting} requests already waiting); "
                                f"retry later")
        stream = self.engine.add_request(prompt_ids, params)
        header = ResponseHeader.new(endpoint.id_prefix, self.settings.model_name)
        timer = RequestTimer(self.metrics, stream.num_prompt_tokens)
        if body.stream:
            events = self._events(stream, timer, header, endpoint, body.include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return await _cancel_on_disconnect(request, self._complete(stream, timer, header, endpoint))

    async def _outputs(self, stream: RequestStream, timer: RequestTimer):
        """The stream's outputs; the request is cancelled if the reader stops before the end."""
        finished = False
        try:
            async for output in stream:
                timer.observe(output)
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.engine.abort(stream.request_id)
                timer.finish("abort")

    async def _complete(self, stream: RequestStream, timer: RequestTimer, header: ResponseHeader,
                        endpoint: _Endpoint) -> Response:
        pieces = []
        async for output in self._outputs(stream, timer):
            pieces.append(output.text)
        if output.finish_reason == "error":
            return APIError(500, "the engine failed while running this request").response()
        usage = Usage.of(stream.num_prompt_tokens, output.num_completion_tokens)
        choice = endpoint.choice("".join(pieces), output.finish_reason, False, False)
        return JSONResponse(header.body(endpoint.object_name, [choice], usage))

    async def _events(self, stream: RequestStream, timer: RequestTimer, header: ResponseHeader,
                      endpoint: _Endpoint, include_usage: bool) -> AsyncIterator[str]:
        first = True
        async for output in self._outputs(stream, timer):
            if output.finish_reason == "error":
                yield _sse(error_body("the engine failed while running this request", "server_error", 500))
                break
            if output.text or output.finished:
                choice = endpoint.choice(output.text, output.finish_reason, True, first)
                yield _sse(header.body(endpoint.chunk_object_name, [choice], None))
                first = False
        if include_usage:
            usage = Usage.of(stream.num_prompt_tokens, output.num_completion_tokens)
            yield _sse(header.body(endpoint.chunk_object_name, [], usage))
        yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _cancel_on_disconnect(request: Request, work) -> Response:
    """Await `work`, cancelling it (and so its request) if the client goes away first."""
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


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_waiting: int = 1024, served_model_name: str | None = None, **engine_kwargs) -> None:
    """Load `model`, then serve it until interrupted; `engine_kwargs` are Config fields."""
    settings = ServerSettings(served_model_name or model, api_key, max_waiting)
    engine = OnlineEngine(model, **engine_kwargs)
    uvicorn.run(build_app(engine, settings), host=host, port=port, log_level="info")
