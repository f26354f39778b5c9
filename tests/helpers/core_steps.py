"""Online engines whose core, in its own process, runs slowed steps, and maybe one that fails."""

import contextlib
import functools
import itertools
import time

import pytest


def run_core_with_step_hook(seconds: float, failing_call: int | None, *args) -> None:
    """Entry point of a spawned engine-core process whose steps each sleep `seconds` first, as on a
    real model, so a test can act mid-generation, and whose `failing_call`-th step (from 1) raises,
    as a device failure would."""
    from nanovllm.engine import core_process
    from nanovllm.engine.engine_core import EngineCore

    real_step, calls = EngineCore.step, itertools.count(1)

    def step(self):
        if next(calls) == failing_call:
            raise RuntimeError("simulated failure")
        time.sleep(seconds)
        return real_step(self)

    EngineCore.step = step
    core_process.run_engine_core(*args)


@contextlib.contextmanager
def core_steps(seconds: float = 0.005, failing_call: int | None = None):
    """Online engines started inside this block run their core with slowed (and maybe one failing) steps."""
    from nanovllm.engine import core_client

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core_client, "run_engine_core", functools.partial(run_core_with_step_hook, seconds, failing_call))
        yield
