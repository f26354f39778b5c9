"""The engine core in a process of its own, reached over ZMQ: the client that `nanovllm serve` uses.

HTTP, JSON and detokenization then never hold the GIL that the step loop
needs. The client binds two IPC sockets in a private folder (`nanovllm-<pid>-*`
in the temp directory; one that a killed client left behind is removed at the
next start), spawns the core process (`core_process.run_engine_core`) and waits
for its report. Requests and aborts go out as msgpack messages; `get_outputs`
waits for the next step's outputs or for the process to die, whichever comes
first.
"""

import glob
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
from contextlib import suppress

import msgspec
import zmq

from nanovllm.config import Config
from nanovllm.core.structured_output import vocabulary_to_json
from nanovllm.engine.core_process import run_engine_core
from nanovllm.engine.engine_client import EngineClient, EngineDeadError
from nanovllm.engine.messages import (
    CoreMessage,
    EngineCoreAbort,
    EngineCoreFailed,
    EngineCoreInfo,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreShutdown,
    EngineStats,
)

_EXIT_WAIT_S = 10  # how long the core may take to stop after the shutdown message before it is killed
_FOLDER_PREFIX = "nanovllm-"  # the sockets' folder in the temp directory: nanovllm-<client pid>-<random>


def remove_stale_socket_folders() -> None:
    """Remove the socket folders of clients that are gone without cleaning up (killed with SIGKILL)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{_FOLDER_PREFIX}*-*")):
        pid = os.path.basename(path)[len(_FOLDER_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _is_running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class EngineStartupError(RuntimeError):
    """The engine core could not start; the message is its error."""


class CoreProcessClient(EngineClient):
    """Runs the engine core in a spawned process and talks to it over two ZMQ sockets.

    The constructor returns once the core is ready, or raises
    EngineStartupError with the core's own error. `get_outputs` is called from
    one thread (the front end's output thread); `add_request` and `abort`
    from any. If the core dies, `get_outputs` raises EngineDeadError once the
    outputs it sent before are read.
    """

    def __init__(self, config: Config, eos_token_ids: tuple[int, ...], vocabulary=None):
        remove_stale_socket_folders()
        self._folder = tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-")
        self._zmq = zmq.Context()
        # a socket closed with messages unsent (to a core that died) drops them: with ZMQ's default of waiting
        # for delivery, terminating the context, even from the garbage collector, would wait forever
        self._zmq.setsockopt(zmq.LINGER, 0)
        self._requests = self._zmq.socket(zmq.PUSH)
        self._requests.setsockopt(zmq.SNDHWM, 0)  # a burst of requests queues, it never blocks
        self._outputs = self._zmq.socket(zmq.PULL)
        self._outputs.setsockopt(zmq.RCVHWM, 0)
        requests_address, outputs_address = f"ipc://{self._folder}/requests", f"ipc://{self._folder}/outputs"
        self._requests.bind(requests_address)
        self._outputs.bind(outputs_address)
        self._send_lock = threading.Lock()  # ZMQ sockets are not thread-safe
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(CoreMessage)
        self._stats = EngineStats()
        self._failure: str | None = None
        self._stopping = False
        self.process = mp.get_context("spawn").Process(
            target=run_engine_core,
            name="nanovllm-engine-core",
            args=(config, eos_token_ids, vocabulary_to_json(vocabulary), requests_address, outputs_address),
        )
        try:
            self.process.start()
        except BaseException:  # e.g. spawned from a script without the `if __name__ == "__main__":` guard
            self._zmq.destroy(linger=0)
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self._poller = zmq.Poller()  # wakes on outputs or on the core's exit
        self._poller.register(self._outputs, zmq.POLLIN)
        self._poller.register(self.process.sentinel, zmq.POLLIN)
        try:
            self.info = self._wait_until_ready()
        except BaseException:
            self.shutdown()
            self._outputs.close(linger=0)
            raise

    def _wait_until_ready(self) -> EngineCoreInfo:
        message = self._receive()
        if message is None:
            raise EngineStartupError(f"the engine core exited with code {self.process.exitcode} while starting")
        if isinstance(message, EngineCoreFailed):
            raise EngineStartupError(message.message)
        return message.info

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(request)

    def abort(self, request_ids: list[str]) -> None:
        self._send(EngineCoreAbort(request_ids))

    def stats(self) -> EngineStats:
        """The load the core reported with its latest step."""
        return self._stats

    def get_outputs(self) -> list[EngineCoreOutput] | None:
        """The next outputs the core sent; None after `shutdown`; EngineDeadError if the core died."""
        while True:
            message = None if self._outputs.closed else self._receive()
            if message is None:
                # the outputs are over: their socket is closed here, in the one thread that reads it. Left
                # open, it would hang the collector: a context collected with a socket open waits for it
                # forever, and the collector has already dropped the context's weak references to it
                self._outputs.close(linger=0)
                if self._stopping:
                    return None
                reason = self._failure or f"the engine core process exited unexpectedly (code {self.process.exitcode})"
                raise EngineDeadError(reason)
            if isinstance(message, EngineCoreFailed):
                self._failure = message.message
            else:
                self._stats = message.stats
                if message.outputs:
                    return message.outputs

    def _receive(self) -> EngineCoreOutputs | EngineCoreFailed | None:
        """The next message from the core; None once the core has exited and sent nothing more."""
        ready = dict(self._poller.poll())
        if self._outputs in ready or self._outputs.poll(0):
            return self._decoder.decode(self._outputs.recv(copy=False))
        return None  # only the sentinel is ready: the process has exited

    def _send(self, message) -> None:
        data = self._encoder.encode(message)
        with self._send_lock:
            if self._stopping:
                raise EngineDeadError("the engine is shut down")
            try:
                # without a connected core a send would wait forever: the core has died
                self._requests.send(data, flags=zmq.NOBLOCK)
            except zmq.Again:
                raise EngineDeadError("the engine core is gone") from None

    def shutdown(self) -> None:
        """Stop the core (killing it if it does not stop in time) and remove the socket files."""
        with self._send_lock:
            if self._stopping:
                return
            self._stopping = True
            if self.process.is_alive():
                with suppress(zmq.Again):
                    self._requests.send(self._encoder.encode(EngineCoreShutdown()), flags=zmq.NOBLOCK)
        self.process.join(_EXIT_WAIT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self._requests.close(linger=0)
        shutil.rmtree(self._folder, ignore_errors=True)
