"""The `nanovllm` command: `nanovllm serve MODEL_DIR [options]`.

Parsing imports neither torch nor transformers, so `--help`, `--version` and a
bad flag answer at once; the engine is imported only to serve.
"""

import argparse
import sys
from dataclasses import fields

from nanovllm import __version__
from nanovllm.config import Config

# Fields the engine fills in itself, not options a user sets.
_DERIVED_FIELDS = {"model", "hf_config", "model_config"}


def _engine_options(parser: argparse.ArgumentParser) -> None:
    """One `--flag` per Config field, with the field's default, type and help."""
    group = parser.add_argument_group("engine", "fields of nanovllm.config.Config")
    for f in fields(Config):
        if f.name in _DERIVED_FIELDS or not f.init:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            # --flag and --no-flag, so that a field on by default can be turned off
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                               help=f"{f.metadata['help']} (default: {'on' if f.default else 'off'})")
        else:
            group.add_argument(flag, type=type(f.default), default=f.default, metavar=f.name.upper(),
                               help=f"{f.metadata['help']} (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `nanovllm` command."""
    parser = argparse.ArgumentParser(prog="nanovllm", description="nanovllm: a small LLM inference engine")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version of nanovllm and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    serve.add_argument("model", metavar="MODEL_DIR", help="a local Hugging Face model folder")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on; 0.0.0.0 for every interface (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: %(default)s)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every endpoint but /health (default: no key)")
    serve.add_argument("--max-waiting", type=int, default=1024,
                       help="answer 503 while the engine holds this many requests it has not scheduled yet, >= 1 "
                            "(default: %(default)s)")
    serve.add_argument("--served-model-name", default=None,
                       help="the model name clients send (default: MODEL_DIR as given)")
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="on SIGINT/SIGTERM, seconds running requests get to finish before they end with an "
                            "error; 0: end them at once (default: %(default)s)")
    serve.add_argument("--max-request-bytes", type=int, default=8 << 20,
                       help="answer 413 to a request body larger than this many bytes (default: %(default)s)")
    serve.add_argument("--chat-template", default=None, metavar="FILE_OR_STRING",
                       help="the chat template for requests that bring none: a file, or the template itself "
                            "(default: the tokenizer's)")
    serve.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="accepted for vLLM's command lines: tool_choice 'auto' is always on")
    serve.add_argument("--tool-call-parser", choices=["hermes"], default="hermes",
                       help="how 'auto' tool calls are read from the reply (<tool_call> tags)")
    _engine_options(serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `nanovllm` console script."""
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    from nanovllm.engine.core_client import EngineStartupError
    from nanovllm.entrypoints.api_server import serve

    try:
        serve(**args)
    except (ValueError, FileNotFoundError, EngineStartupError) as e:
        sys.exit(f"nanovllm serve: {e}")


if __name__ == "__main__":
    main()
