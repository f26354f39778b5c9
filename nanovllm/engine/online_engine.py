"""The online engine: requests arrive at any time while a background thread steps the engine."""

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

from nanovllm.engine.llm_engine import LLMEngine, Prompt
from nanovllm.engine.sequence import Sequence
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    """What one step added to one request: new tokens and text, and whether it is done.

    `finish_reason` is set on the last output: "stop" (an end-of-sequence or stop token, or a stop string), "length"
    (max_tokens or max_model_len), "abort" (cancelled) or "error" (the step failed).
    """

    request_id: int
    token_ids: list[int]
    text: str
    num_prompt_tokens: int
    num_completion_tokens: int
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class EngineStats:
    """A consistent snapshot of the engine's load, taken by its thread."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0


class RequestStream:
    """The outputs of one request, in order, the last one finished.

    Iterate it with `for` from a plain thread, or with `async for` when it was
    added from inside an event loop (outputs then arrive through that loop).
    """

    def __init__(self, request_id: int, num_prompt_tokens: int):
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        self._outputs = queue.SimpleQueue() if self.loop is None else asyncio.Queue()

    def put(self, output: RequestOutput) -> None:
        """Deliver an output; for an async stream, call it on the stream's loop."""
        self._outputs.put_nowait(output)

    def __iter__(self):
        assert self.loop is None, "a stream added inside an event loop is read with `async for`"
        while True:
            output = self._outputs.get()
            yield output
            if output.finished:
                return

    async def __aiter__(self):
        assert self.loop is not None, "a stream added outside an event loop is read with `for`"
        while True:
            output = await self._outputs.get()
            yield output
            if output.finished:
                return


class _Request:
    """Engine-thread state of one live request."""

    def __init__(self, seq: Sequence, stream: RequestStream):
        self.seq = seq
        self.stream = stream
        self.num_sent_tokens = 0
        self.num_sent_chars = 0


class OnlineEngine:
    """Owns an LLMEngine in a background thread that steps it while requests come and go.

    `add_request` checks and queues a request from any thread and returns its
    stream; `abort` cancels one, freeing its KV blocks before the next step.
    Requests are checked in the caller's thread, so a bad one raises ValueError
    there and never reaches the loop.
    """

    def __init__(self, engine: LLMEngine):
        self.llm_engine = engine
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._new: list[_Request] = []
        self._aborted: list[int] = []
        self._stopping = False
        self._stats = EngineStats()
        self._requests: dict[int, _Request] = {}
        self._thread = threading.Thread(target=self._run, name="nanovllm-engine", daemon=True)
        self._thread.start()

    def add_request(self, prompt: Prompt, sampling_params: SamplingParams) -> RequestStream:
        """Queue a request and return its output stream; ValueError if it cannot be served."""
        seq = self.llm_engine.make_sequence(prompt, sampling_params)
        stream = RequestStream(seq.seq_id, seq.num_prompt_tokens)
        with self._lock:
            if self._stopping:
                raise RuntimeError("the engine is shut down")
            self._new.append(_Request(seq, stream))
            self._stats = EngineStats(self._stats.num_running, self._stats.num_waiting + 1,
                                      self._stats.kv_cache_usage)
            self._wakeup.notify()
        return stream

    def abort(self, request_id: int) -> None:
        """Cancel a request (no-op if it already finished); its stream ends with "abort"."""
        with self._lock:
            self._aborted.append(request_id)
            self._wakeup.notify()

    def stats(self) -> EngineStats:
        """Requests running and waiting (queued ones included) and the KV-cache fraction in use."""
        with self._lock:
            return self._stats

    def shutdown(self) -> None:
        """Stop the loop; every unfinished request ends with "abort"."""
        with self._lock:
            self._stopping = True
            self._wakeup.notify()
        self._thread.join()

    def _run(self) -> None:
        while self._take_commands():
            if self.llm_engine.is_finished():
                continue
            try:
                self.llm_engine.step()
                self._publish_outputs()
            except Exception:
                logger.exception("engine step failed; ending every live request with an error")
                self._end_all("error")
        self._end_all("abort")

    def _take_commands(self) -> bool:
        """Admit new requests and apply aborts; wait while there is nothing to do.
        Returns False once the engine is shutting down."""
        with self._lock:
            while not (self._new or self._aborted or self._stopping) and self.llm_engine.is_finished():
                self._wakeup.wait()
            new, self._new = self._new, []
            aborted, self._aborted = self._aborted, []
            for request in new:
                self._requests[request.seq.seq_id] = request
                self.llm_engine.scheduler.add(request.seq)
            for request_id in aborted:
                self._end(request_id, "abort")
            self._stats = self._snapshot()
            return not self._stopping

    def _snapshot(self) -> EngineStats:
        scheduler = self.llm_engine.scheduler
        block_manager = scheduler.block_manager
        usage = 1.0 - block_manager.num_free_blocks / len(block_manager.blocks)
        return EngineStats(len(scheduler.running), len(scheduler.waiting), usage)

    def _publish_outputs(self) -> None:
        deliveries = [(request.stream, self._output(request, request.seq.finish_reason))
                      for request in self._requests.values()
                      if request.seq.num_completion_tokens > request.num_sent_tokens]
        for stream, output in deliveries:
            if output.finished:
                del self._requests[stream.request_id]
        with self._lock:
            self._stats = self._snapshot()
        self._deliver(deliveries)

    def _output(self, request: _Request, finish_reason: str | None) -> RequestOutput:
        """The tokens and text `request` gained since its last output."""
        seq = request.seq
        new_tokens = seq.completion_token_ids[request.num_sent_tokens:]
        # stream_text holds back what a stop string may still cut off
        text = seq.stream_text
        new_text = text[request.num_sent_chars:]
        request.num_sent_tokens = seq.num_completion_tokens
        request.num_sent_chars = len(text)
        return RequestOutput(seq.seq_id, new_tokens, new_text, seq.num_prompt_tokens,
                             seq.num_completion_tokens, finish_reason)

    def _end(self, request_id: int, reason: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        self.llm_engine.scheduler.abort(request.seq)
        self._deliver([(request.stream, self._output(request, reason))])

    def _end_all(self, reason: str) -> None:
        with self._lock:
            for request_id in list(self._requests):
                self._end(request_id, reason)
            self._stats = self._snapshot()

    @staticmethod
    def _deliver(deliveries: list[tuple[RequestStream, RequestOutput]]) -> None:
        # One wake-up per event loop per step, not one per request.
        by_loop: dict = {}
        for stream, output in deliveries:
            if stream.loop is None:
                stream.put(output)
            else:
                by_loop.setdefault(stream.loop, []).append((stream, output))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:
                pass  # the loop has closed; nobody is reading these streams any more


def _put_all(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, output in items:
        stream.put(output)
