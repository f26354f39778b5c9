"""How a front end talks to the engine core: requests and aborts in, each step's outputs out.

`InprocClient` runs the core in the caller's thread (offline generation);
`BackgroundClient` runs the core's busy loop in a thread of its own, which
takes new requests and aborts between steps (the online engine).
"""

import logging
import queue
import threading
from abc import ABC, abstractmethod

from nanovllm.engine.engine_core import EngineCore
from nanovllm.engine.messages import EngineCoreOutput, EngineCoreRequest, EngineStats

logger = logging.getLogger(__name__)


class EngineClient(ABC):
    """The front end's handle on an engine core; `info` is what the core found at start-up."""

    def __init__(self, core: EngineCore):
        self.info = core.info

    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None:
        """Hand a checked request to the core."""

    @abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Drop requests in the core (finished or unknown ids are ignored)."""

    @abstractmethod
    def get_outputs(self) -> list[EngineCoreOutput] | None:
        """The next step's outputs; None once the core has stopped."""

    @abstractmethod
    def stats(self) -> EngineStats:
        """The core's load."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the core."""


class InprocClient(EngineClient):
    """The core in the caller's thread: `get_outputs` runs one overlapped step."""

    def __init__(self, core: EngineCore):
        super().__init__(core)
        self.core = core

    def add_request(self, request: EngineCoreRequest) -> None:
        self.core.add_request(request)

    def abort(self, request_ids: list[str]) -> None:
        self.core.abort(request_ids)

    def get_outputs(self) -> list[EngineCoreOutput]:
        return self.core.step()

    def stats(self) -> EngineStats:
        return self.core.stats()

    def shutdown(self) -> None:
        self.core.shutdown()


_STOP = object()


class BackgroundClient(EngineClient):
    """The core's busy loop in a background thread.

    Requests and aborts wait in an inbox that the loop drains between steps; it
    sleeps only when the core has nothing to run. Each step's outputs go to an
    outbox that `get_outputs` reads. A step that raises ends every live request
    with finish_reason "error", and the loop goes on.
    """

    def __init__(self, core: EngineCore):
        super().__init__(core)
        self.core = core
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stats = EngineStats()
        self._thread = threading.Thread(target=self._run, name="nanovllm-engine-core", daemon=True)
        self._thread.start()

    def add_request(self, request: EngineCoreRequest) -> None:
        self._inbox.put(("add", request))

    def abort(self, request_ids: list[str]) -> None:
        self._inbox.put(("abort", request_ids))

    def get_outputs(self) -> list[EngineCoreOutput] | None:
        outputs = self._outbox.get()
        return None if outputs is _STOP else outputs

    def stats(self) -> EngineStats:
        return self._stats

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join()

    def _run(self) -> None:
        while self._take_commands():
            try:
                outputs = self.core.step()
            except Exception:
                logger.exception("engine step failed; ending every live request with an error")
                outputs = [EngineCoreOutput(request_id, [], finish_reason="error") for request_id in self.core.reset()]
            self._stats = self.core.stats()
            if outputs:
                self._outbox.put(outputs)
        self.core.shutdown()
        self._outbox.put(_STOP)

    def _take_commands(self) -> bool:
        """Apply queued requests and aborts, waiting for one while the core is idle; False on "stop"."""
        while True:
            try:
                command, value = self._inbox.get(block=not self.core.has_work())
            except queue.Empty:
                return True
            if command == "stop":
                return False
            if command == "add":
                self.core.add_request(value)
            else:
                self.core.abort(value)
            self._stats = self.core.stats()
