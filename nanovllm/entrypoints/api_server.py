"""An OpenAI-compatible HTTP server (FastAPI) on top of the online engine: routes, authentication, errors."""

import asyncio
import contextlib
import hmac
import logging
import socket
import time
from dataclasses import fields

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from nanovllm import __version__
from nanovllm.entrypoints.body_limit import BodyLimit
from nanovllm.entrypoints.generation import APIError, GenerationHandler
from nanovllm.entrypoints.internal_errors import InternalErrors
from nanovllm.entrypoints.metrics import ServerMetrics
from nanovllm.entrypoints.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from nanovllm.entrypoints.server_settings import ServerSettings
from nanovllm.frontend.chat import load_chat_template, render_chat
from nanovllm.frontend.input_processor import check_unicode
from nanovllm.frontend.online_engine import OnlineEngine
from nanovllm.utils.log_setup import configure_logging

logger = logging.getLogger(__name__)

_WATCH_POLL_S = 0.5  # how often the server checks that the engine can go on, and the shutdown deadline
_DEATH_LINGER_S = 1.0  # how long it then answers /health with 503 before it exits
_SETTING_NAMES = {f.name for f in fields(ServerSettings)} - {"model_name"}
_LAST_EVENTS_S = 2.0  # after the shutdown grace period: time for the requests' error events to go out

__all__ = ["APIError", "ServerSettings", "build_app", "serve"]


def build_app(engine: OnlineEngine, settings: ServerSettings) -> FastAPI:
    """The FastAPI application serving `engine` under `settings.model_name`; it shuts the engine down
    when the server stops."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        engine.shutdown()

    app = FastAPI(title="nanovllm", lifespan=lifespan)
    app.add_middleware(InternalErrors)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    metrics = ServerMetrics(engine, settings.model_name)
    generation = GenerationHandler(engine, settings, metrics)
    _add_error_handlers(app)

    async def require_api_key(request: Request) -> None:
        if settings.api_key is None:
            return
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {settings.api_key}".encode()):
            raise APIError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'")

    # every endpoint but /health
    guarded = [Depends(require_api_key)]
    card = {
        "id": settings.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "nanovllm",
        "max_model_len": engine.client.info.max_model_len,
    }

    @app.get("/health")
    async def health() -> Response:
        # 503 once the engine core has died or the server is shutting down
        return Response(status_code=200 if engine.healthy else 503)

    @app.get("/version", dependencies=guarded)
    async def server_version() -> dict:
        return {"version": __version__}

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}", dependencies=guarded)
    async def model(model_id: str) -> dict:
        if model_id != settings.model_name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {settings.model_name!r}")
        return card

    @app.get("/metrics", dependencies=guarded)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(body: TokenizeRequest) -> dict:
        generation.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send either prompt or messages")
        if body.messages is not None:
            text = render_chat(
                engine.tokenizer,
                [m.for_template() for m in body.messages],
                body.add_generation_prompt,
                body.continue_final_message,
                chat_template=body.chat_template or settings.chat_template,
                chat_template_kwargs=body.chat_template_kwargs,
            )
            tokens = engine.input_processor.tokenize(text, add_special_tokens=False)
        else:
            tokens = engine.input_processor.tokenize(body.prompt, add_special_tokens=body.add_special_tokens)
        return {"count": len(tokens), "max_model_len": engine.client.info.max_model_len, "tokens": tokens}

    @app.post("/detokenize", dependencies=guarded)
    async def detokenize(body: DetokenizeRequest) -> dict:
        generation.check_model(body.model)
        if engine.tokenizer is None:
            raise APIError(400, "this server runs without a tokenizer (skip_tokenizer_init)")
        tokens = engine.input_processor.check_token_ids(body.tokens)
        text = engine.tokenizer.decode(tokens)
        check_unicode(text, "the text")
        return {"prompt": text}

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await generation.completions(body, request)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await generation.chat(body, request)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

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


class _Server(uvicorn.Server):
    """uvicorn's server, which on SIGINT/SIGTERM first makes the engine refuse new requests (503) and
    gives running ones `shutdown_timeout` seconds, then ends those left with an error (a last error event
    for a stream) before uvicorn closes the connections; and which stops (after a short linger for the
    error events to go out) when the engine cannot go on."""

    def __init__(self, config: uvicorn.Config, engine: OnlineEngine, shutdown_timeout: float):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self._exit_asked_at: float | None = None

    def handle_exit(self, sig, frame) -> None:
        self.engine.stop_accepting()
        if self._exit_asked_at is None:
            self._exit_asked_at = time.monotonic()
        super().handle_exit(sig, frame)

    async def serve(self, sockets=None) -> None:
        watchdog = asyncio.create_task(self._watch_engine())
        try:
            await super().serve(sockets)
        finally:
            watchdog.cancel()

    async def _watch_engine(self) -> None:
        grace_over = False
        while self.engine.failure is None:
            await asyncio.sleep(_WATCH_POLL_S)
            asked = self._exit_asked_at
            if not grace_over and asked is not None and time.monotonic() - asked >= self.shutdown_timeout:
                grace_over = True
                self.engine.end_all("error", "the server shut down before this request finished")
        logger.error("the engine cannot go on (%s); shutting the server down", self.engine.failure)
        await asyncio.sleep(_DEATH_LINGER_S)
        self.should_exit = True


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not listening yet); ValueError if the address is taken or not this
    machine's."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a closed server's port is free
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port or --host, "
            f"or stop the program that uses it"
        ) from None
    return sock


def _url(sock: socket.socket) -> str:
    """The http:// URL of a bound socket (an IPv6 address in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(model: str, served_model_name: str | None = None, **options) -> None:
    """Load `model` (its engine core in a process of its own), then serve it until interrupted.

    `model` is a model folder or a Hugging Face Hub id. `options` are ServerSettings fields (`chat_template`
    as a template file's path or the template itself) and Config fields; the model's public name is
    `served_model_name`, by default `model` as given. The address is taken
    first, so that a port in use is a ValueError before the model loads. The engine's start-up report and
    the URL the server listens on are logged (`nanovllm.utils.log_setup` says where the log goes). On
    SIGINT/SIGTERM the server refuses new requests and gives running ones
    `shutdown_timeout` seconds to finish before they end with an error; the
    core process is stopped either way. If the engine cannot go on (its core
    died, or a fault of the front end's own), live requests end with an error,
    /health answers 503 and the server exits with an error (SystemExit).
    """
    server_options = {name: options.pop(name) for name in _SETTING_NAMES & set(options)}
    if server_options.get("chat_template") is not None:
        server_options["chat_template"] = load_chat_template(server_options["chat_template"])
    settings = ServerSettings(served_model_name or model, **server_options)
    configure_logging()
    if settings.enable_auto_tool_choice:
        logger.info(
            "--enable-auto-tool-choice: tool_choice 'auto' is always on, with the %s parser", settings.tool_call_parser
        )
    with _bind(settings.host, settings.port) as sock:
        engine = OnlineEngine(model, **options)
        logger.info("serving %r at %s (the OpenAI API under /v1)", settings.model_name, _url(sock))
        config = uvicorn.Config(
            build_app(engine, settings),
            host=settings.host,
            port=settings.port,
            log_level="info",
            timeout_graceful_shutdown=settings.shutdown_timeout + _LAST_EVENTS_S,
        )
        try:
            _Server(config, engine, settings.shutdown_timeout).run(sockets=[sock])  # on uvloop where it is installed
        finally:
            engine.shutdown()
    if engine.failure is not None:
        raise SystemExit(f"nanovllm serve: the engine cannot go on: {engine.failure}")
