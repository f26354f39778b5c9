"""How a front end talks to the engine core: requests and aborts in, each step's outputs out.

`InprocClient` runs the core in the caller's thread (offline generation);
`CoreProcessClient` (in `core_client.py`) runs it in a process of its own
(serving).
"""

from abc import ABC, abstractmethod

from nanovllm.config import Config
from nanovllm.engine.engine_core import EngineCore
from nanovllm.engine.messages import EngineCoreInfo, EngineCoreOutput, EngineCoreRequest, EngineStats


class EngineDeadError(RuntimeError):
    """The engine core stopped working (its process died, or a step failed); nothing more will run."""


class EngineClient(ABC):
    """The front end's handle on an engine core, which it starts for `config`; `info` is what the
    core found at start-up. `vocabulary` describes the tokens for grammars (None: no structured
    outputs)."""

    info: EngineCoreInfo

    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None:
        """Hand a checked request to the core."""

    @abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Drop requests in the core (finished or unknown ids are ignored)."""

    @abstractmethod
    def get_outputs(self) -> list[EngineCoreOutput] | None:
        """The next step's outputs; None once the core has been shut down."""

    @abstractmethod
    def stats(self) -> EngineStats:
        """The core's load."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the core."""


class InprocClient(EngineClient):
    """The core in the caller's thread: `get_outputs` runs one overlapped step."""

    def __init__(self, config: Config, eos_token_ids: tuple[int, ...], vocabulary=None):
        self.core = EngineCore(config, eos_token_ids, vocabulary)
        self.info = self.core.info

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
