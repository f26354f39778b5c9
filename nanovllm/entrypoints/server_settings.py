"""The server's settings, defined once: defaults, checks and the help line `nanovllm serve --help` shows.

Importing this module imports neither torch nor the web stack, so that the
command line parses at once.
"""

from dataclasses import dataclass, field

from nanovllm.entrypoints.reasoning import REASONING_PARSERS
from nanovllm.entrypoints.tool_call_formats import FORMATS

TOOL_CALL_PARSERS = tuple(FORMATS)


def _setting(default, help: str, **flag):
    """A setting with its default, its help line and, in `flag`, what argparse needs beyond them."""
    return field(default=default, metadata={"help": help, **flag})


@dataclass(frozen=True)
class ServerSettings:
    """How the server listens and answers. `model_name` is the model's public name (what clients send);
    `chat_template` is the template's text (None: the tokenizer's)."""

    model_name: str
    host: str = _setting("127.0.0.1", "address to listen on; 0.0.0.0 for every interface")
    port: int = _setting(8000, "TCP port to listen on")
    api_key: str | None = _setting(
        None, "require 'Authorization: Bearer KEY' on every endpoint but /health (default: no key)", type=str
    )
    max_waiting: int = _setting(
        1024,
        "answer 503 while the engine holds this many requests it has not scheduled yet; also the most "
        "completions one request may make",
    )
    max_n: int = _setting(128, "the most completions (n, best_of) one prompt may ask for")
    max_logprobs: int = _setting(20, "the most logprob alternatives (logprobs, top_logprobs, prompt_logprobs)")
    max_request_bytes: int = _setting(8 << 20, "answer 413 to a request body larger than this many bytes")
    shutdown_timeout: float = _setting(
        30.0,
        "on SIGINT/SIGTERM, seconds running requests get to finish before they end with an error; 0: end them at once",
    )
    chat_template: str | None = _setting(
        None,
        "the chat template for requests that bring none: a file, or the template itself (default: the tokenizer's)",
        type=str,
        metavar="FILE_OR_STRING",
    )
    enable_auto_tool_choice: bool = _setting(
        False, "accepted for vLLM's command lines: tool_choice 'auto' is always on"
    )
    tool_call_parser: str = _setting(
        "hermes",
        "how 'auto' tool calls are read from the reply: hermes (<tool_call> JSON), qwen3_coder (Qwen3-Coder's and "
        "Qwen3.5's <tool_call><function=...> XML), llama3_json, mistral ([TOOL_CALLS]) or openai (gpt-oss's harmony "
        "messages to functions.NAME)",
        choices=TOOL_CALL_PARSERS,
    )
    reasoning_parser: str | None = _setting(
        None,
        "split chat replies into reasoning_content (up to </think>; openai_gptoss: harmony's analysis channel) and "
        "content (default: no split)",
        type=str,
        choices=REASONING_PARSERS,
    )

    def __post_init__(self) -> None:
        for name in ("max_waiting", "max_n", "max_logprobs", "max_request_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, got {self.shutdown_timeout}")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser {self.tool_call_parser!r} is not available; this server parses "
                f"{', '.join(TOOL_CALL_PARSERS)} calls"
            )
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser {self.reasoning_parser!r} is not available; the reasoning parsers are "
                f"{', '.join(REASONING_PARSERS)}"
            )
