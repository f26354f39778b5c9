"""The engine core in a process of its own: a busy loop that takes requests and aborts between steps.

The process connects two ZMQ sockets that its client has bound: requests,
aborts and the shutdown come in on one, msgpack-encoded `ClientMessage`s;
start-up news and every step's outputs go out on the other. It reports
`EngineCoreReady` (or `EngineCoreFailed` with the start-up error) before
anything else. After a step fails, or a tensor-parallel worker dies, the core's
state is unknown: it ends every live request with an error, reports the
failure and exits non-zero, and the client turns that into a dead engine. It
exits as well when the process that spawned it is gone.
"""

import logging
import sys
import traceback

import msgspec
import zmq

from nanovllm.config import Config
from nanovllm.core.structured_output import vocabulary_from_json
from nanovllm.engine.engine_core import EngineCore
from nanovllm.engine.messages import (
    ClientMessage,
    EngineCoreAbort,
    EngineCoreFailed,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineStats,
)
from nanovllm.utils.heap import freeze_start_up_objects
from nanovllm.utils.log_setup import configure_logging
from nanovllm.utils.processes import exit_with_parent, ignore_interrupts

logger = logging.getLogger(__name__)

_IDLE_CHECK_MS = 1000  # an idle core checks its tensor-parallel workers this often


def run_engine_core(
    config: Config,
    eos_token_ids: tuple[int, ...],
    vocabulary_json: str | None,
    requests_address: str,
    outputs_address: str,
) -> None:
    """Entry point of the core process: start the core, report, then serve until told to stop."""
    configure_logging()  # a spawned process starts without the parent's logging set-up
    exit_with_parent()
    ignore_interrupts()
    context = zmq.Context()
    requests, outputs = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    requests.setsockopt(zmq.RCVHWM, 0)
    outputs.setsockopt(zmq.SNDHWM, 0)  # never drop or wait on outputs: the client reads them all
    requests.connect(requests_address)
    outputs.connect(outputs_address)
    encoder = msgspec.msgpack.Encoder()
    try:
        core = EngineCore(config, eos_token_ids, vocabulary_from_json(vocabulary_json))
    except BaseException as e:
        outputs.send(encoder.encode(EngineCoreFailed(f"{type(e).__name__}: {e}")))
        context.destroy(linger=5000)
        sys.exit(1)
    freeze_start_up_objects()
    outputs.send(encoder.encode(EngineCoreReady(core.info)))
    code = BusyLoop(core, requests, outputs).run()
    context.destroy(linger=5000)  # let the last outputs leave
    sys.exit(code)


class BusyLoop:
    """Applies every queued message, runs a step, sends its outputs; sleeps only while the core is idle,
    waking every second to check that its tensor-parallel workers live."""

    def __init__(self, core: EngineCore, requests: zmq.Socket, outputs: zmq.Socket):
        self.core = core
        self.requests = requests
        self.outputs = outputs
        self.decoder = msgspec.msgpack.Decoder(ClientMessage)
        self.encoder = msgspec.msgpack.Encoder()
        self.sent_stats = EngineStats()

    def run(self) -> int:
        """Serve until a shutdown message (exit code 0) or a failure (exit code 1)."""
        try:
            while self._take_messages():
                self._send(self.core.step())
        except Exception as e:
            logger.error("the engine core failed:\n%s", traceback.format_exc())
            ended = [EngineCoreOutput(request_id, [], finish_reason="error") for request_id in self.core.reset()]
            self._send(ended, force=True)
            self.outputs.send(self.encoder.encode(EngineCoreFailed(f"{type(e).__name__}: {e}")))
            self.core.shutdown()
            return 1
        self.core.shutdown()
        return 0

    def _take_messages(self) -> bool:
        """Apply every queued message, waiting for one while the core has nothing to run; False on shutdown.
        The step that follows reports the load: reported before it, requests it is about to run would
        count as waiting and a burst the core can take at once would be refused."""
        while True:
            busy = self.core.has_work()
            if not self.requests.poll(0 if busy else _IDLE_CHECK_MS):
                if busy:
                    break
                self.core.check_workers()
                continue
            message = self.decoder.decode(self.requests.recv(copy=False))
            if isinstance(message, EngineCoreRequest):
                self._add(message)
            elif isinstance(message, EngineCoreAbort):
                self.core.abort(message.request_ids)
            else:
                return False
        return True

    def _add(self, request: EngineCoreRequest) -> None:
        """Queue a request; one the core cannot take (its grammar fails to compile) ends with an error
        at once, and the others go on."""
        try:
            self.core.add_request(request)
        except Exception:
            logger.exception("the engine core could not take request %s", request.request_id)
            self._send([EngineCoreOutput(request.request_id, [], finish_reason="error")])

    def _send(self, outputs: list[EngineCoreOutput], force: bool = False) -> None:
        stats = self.core.stats()
        if outputs or force or stats != self.sent_stats:
            self.outputs.send(self.encoder.encode(EngineCoreOutputs(outputs, stats)))
            self.sent_stats = stats
