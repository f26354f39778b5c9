"""configure_logging: a stderr handler for the `nanovllm` logger only where the application set up none."""

import logging

import pytest

from nanovllm.utils.log_setup import configure_logging


@pytest.fixture
def bare_logging(monkeypatch):
    """Logging as a program that set up nothing finds it, restored after. The test calls what it yields
    first: that sets aside the handlers pytest adds to the root logger when the test starts."""
    logger = logging.getLogger("nanovllm")
    level = logger.level
    monkeypatch.setattr(logger, "handlers", [])
    yield lambda: monkeypatch.setattr(logging.getLogger(), "handlers", [])
    logger.setLevel(level)


def test_info_lines_go_to_stderr_by_default(bare_logging, capsys):
    bare_logging()
    configure_logging()
    logging.getLogger("nanovllm.engine").info("started")
    logging.getLogger("nanovllm.engine").debug("details")
    err = capsys.readouterr().err
    assert "INFO " in err and "[nanovllm.engine] started" in err and "details" not in err
    configure_logging()  # once only: a second engine adds no second handler
    assert len(logging.getLogger("nanovllm").handlers) == 1


def test_the_level_comes_from_the_environment(bare_logging, capsys, monkeypatch):
    monkeypatch.setenv("NANOVLLM_LOGGING_LEVEL", "warning")
    bare_logging()
    configure_logging()
    logging.getLogger("nanovllm.engine").info("started")
    logging.getLogger("nanovllm.engine").warning("careful")
    err = capsys.readouterr().err
    assert "started" not in err and "WARNING " in err and "careful" in err


def test_a_bad_level_is_named(bare_logging, monkeypatch):
    monkeypatch.setenv("NANOVLLM_LOGGING_LEVEL", "LOUD")
    bare_logging()
    with pytest.raises(ValueError, match=r"NANOVLLM_LOGGING_LEVEL='LOUD' is not a logging level; use DEBUG, INFO"):
        configure_logging()


def test_an_application_that_set_up_logging_keeps_it(bare_logging):
    bare_logging()
    logging.getLogger().addHandler(logging.NullHandler())
    configure_logging()
    assert logging.getLogger("nanovllm").handlers == []


def test_the_set_up_can_be_turned_off(bare_logging, monkeypatch):
    monkeypatch.setenv("NANOVLLM_CONFIGURE_LOGGING", "0")
    bare_logging()
    configure_logging()
    assert logging.getLogger("nanovllm").handlers == []
