"""The `nanovllm` command (also `python -m nanovllm`): `nanovllm serve MODEL [options]`.

Parsing imports neither torch nor transformers, so `--help`, `--version` and a
bad flag answer at once; the engine is imported only to serve.
"""

import argparse
import sys
from dataclasses import fields

from nanovllm import __version__
from nanovllm.config import Config
from nanovllm.entrypoints.server_settings import ServerSettings

# Fields the engine fills in itself, not options a user sets.
_DERIVED_FIELDS = {"model", "hf_config", "model_config"}

_SERVE_EPILOG = """environment:
  NANOVLLM_LOGGING_LEVEL    level of the log on stderr: DEBUG, INFO (default), WARNING, ERROR
  NANOVLLM_CONFIGURE_LOGGING=0
                            leave Python's logging alone (no handler for the nanovllm logger)
  HF_HUB_OFFLINE=1          resolve a Hugging Face model id from the local cache only, without the network
  HF_HUB_CACHE              the Hugging Face cache folder (default: ~/.cache/huggingface/hub)"""


def _engine_options(parser: argparse.ArgumentParser) -> None:
    """One `--flag` per Config field, with the field's default, type and help."""
    group = parser.add_argument_group("engine", "fields of nanovllm.config.Config")
    for f in fields(Config):
        if f.name not in _DERIVED_FIELDS and f.init:
            _add_flag(group, f)


def _server_options(parser: argparse.ArgumentParser) -> None:
    """One `--flag` per ServerSettings field but the model's name, with the setting's default, type and help."""
    group = parser.add_argument_group("server", "fields of nanovllm.entrypoints.server_settings.ServerSettings")
    for f in fields(ServerSettings):
        if f.name != "model_name":
            _add_flag(group, f)


def _add_flag(group, f) -> None:
    """`--name` for the dataclass field `f` (`--name` / `--no-name` for a boolean)."""
    flag = "--" + f.name.replace("_", "-")
    extra = {key: value for key, value in f.metadata.items() if key != "help"}
    if isinstance(f.default, bool):
        # --flag and --no-flag, so that a field on by default can be turned off
        group.add_argument(
            flag,
            action=argparse.BooleanOptionalAction,
            default=f.default,
            help=f"{f.metadata['help']} (default: {'on' if f.default else 'off'})",
        )
        return
    help_line = f.metadata["help"] + ("" if f.default is None else " (default: %(default)s)")
    group.add_argument(
        flag, **{"type": type(f.default), "default": f.default, "metavar": f.name.upper(), "help": help_line, **extra}
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `nanovllm` command."""
    parser = argparse.ArgumentParser(prog="nanovllm", description="nanovllm: a small LLM inference engine")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version of nanovllm and exit"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "model",
        metavar="MODEL",
        help="a local Hugging Face model folder, or a Hugging Face Hub model id (Qwen/Qwen3-0.6B): downloaded into "
        "the Hugging Face cache, or read from it where the Hub cannot be reached",
    )
    serve.add_argument(
        "--served-model-name", default=None, help="the model name clients send (default: MODEL as given)"
    )
    serve.add_argument(
        "--headless",
        action="store_true",
        help="with --nnodes > 1 on a node other than 0 (--node-rank K): run this node's tensor-parallel ranks and "
        "no server, until node 0's engine stops",
    )
    _server_options(serve)
    _engine_options(serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `nanovllm` console script."""
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    if args.pop("headless"):
        sys.exit(_run_headless(args))
    from nanovllm.engine.core_client import EngineStartupError
    from nanovllm.entrypoints.api_server import serve

    try:
        serve(**args)
    except (ValueError, FileNotFoundError, EngineStartupError) as e:
        sys.exit(f"nanovllm serve: {e}")


def _run_headless(args: dict) -> int | str:
    """`nanovllm serve --headless`: this node's ranks with the engine flags of `args` (the server's are
    not used); the exit code, or the error's message."""
    from nanovllm.frontend.model_source import resolve_model
    from nanovllm.utils.log_setup import configure_logging
    from nanovllm.worker.headless import run_headless

    engine = {f.name for f in fields(Config) if f.init} - {"model"}
    configure_logging()
    try:
        config = Config.from_kwargs(resolve_model(args["model"]), **{k: v for k, v in args.items() if k in engine})
        return run_headless(config)
    except (ValueError, FileNotFoundError) as e:
        return f"nanovllm serve --headless: {e}"


if __name__ == "__main__":
    main()
