"""Where the `nanovllm` logger's records go when the application has not said.

`LLM()`, `nanovllm serve` and the engine core's process call
`configure_logging()` first. If no handler is set up yet (neither on the root
logger nor on `nanovllm`), it gives the `nanovllm` logger one that writes to
stderr at the level NANOVLLM_LOGGING_LEVEL names (default INFO), so that the
start-up report shows. An application that set up logging itself keeps its
own handlers and levels. NANOVLLM_CONFIGURE_LOGGING=0 leaves logging alone
in every case.
"""

import logging
import os
import sys

LOGGER_NAME = "nanovllm"
_FORMAT = "%(levelname)s %(asctime)s [%(name)s] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


def configure_logging() -> None:
    """Give the `nanovllm` logger a stderr handler at NANOVLLM_LOGGING_LEVEL (default INFO), unless logging is
    set up already or NANOVLLM_CONFIGURE_LOGGING=0; ValueError for a level that `logging` does not know."""
    if os.environ.get("NANOVLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    logger = logging.getLogger(LOGGER_NAME)
    if logger.handlers or logging.getLogger().handlers:
        return
    name = os.environ.get("NANOVLLM_LOGGING_LEVEL", "INFO").upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError(
            f"NANOVLLM_LOGGING_LEVEL={name!r} is not a logging level; use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
