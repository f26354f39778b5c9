"""The online engine: requests arrive at any time while the engine core runs in a process of its own."""

import asyncio
import logging
import queue
import threading
from contextlib import suppress

from nanovllm.engine.core_client import CoreProcessClient
from nanovllm.engine.engine_client import EngineDeadError
from nanovllm.engine.messages import EngineStats
from nanovllm.frontend.engine_frontend import EngineFrontend
from nanovllm.frontend.input_processor import ProcessedPrompt, Prompt
from nanovllm.frontend.output_processor import ParentRequest
from nanovllm.outputs import CompletionOutput, RequestOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.heap import unfreeze_objects

logger = logging.getLogger(__name__)


class RequestStream:
    """The outputs of one request, in order, the last one finished: RequestOutputs whose completions
    hold only what is new since the previous output (only the completions that changed).

    Iterate it with `for` from a plain thread, or with `async for` when it was
    added from inside an event loop (outputs then arrive through that loop).
    """

    def __init__(self, request_id: str, num_prompt_tokens: int):
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        self._queue = queue.SimpleQueue() if self.loop is None else None
        self._arrived: list[RequestOutput] = []  # async streams: outputs not yet taken
        self._waiter: asyncio.Future | None = None  # async streams: the reader waiting for outputs
        self.error: str | None = None  # why the request ended with finish_reason "error"

    def put(self, output: RequestOutput) -> None:
        """Deliver an output; for an async stream, call it on the stream's loop."""
        if self._queue is not None:
            self._queue.put(output)
            return
        self._arrived.append(output)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __iter__(self):
        assert self.loop is None, "a stream added inside an event loop is read with `async for`"
        while True:
            output = self._queue.get()
            yield output
            if output.finished:
                return

    async def __aiter__(self):
        async for batch in self.batches():
            for output in batch:
                yield output

    async def batches(self):
        """`async for` over lists of the outputs that have arrived, at least one each: a reader that
        falls behind takes several steps' outputs at once."""
        assert self.loop is not None, "a stream added outside an event loop is read with `async for`"
        while True:
            if not self._arrived:
                self._waiter = self.loop.create_future()
                await self._waiter
            batch, self._arrived = self._arrived, []
            yield batch
            if batch[-1].finished:
                return


class OnlineEngine(EngineFrontend):
    """Serves requests as they come: the engine core's busy loop runs in a process of its own, and an
    output thread here turns each step's token ids into text on every request's stream.

    `add_request` checks and queues a request from any thread and returns its
    stream; `abort` cancels one, freeing its KV blocks before the next step.
    Requests are checked in the caller's thread, so a bad one raises ValueError
    there and never reaches the core. If the core dies, every live stream
    ends with finish_reason "error", `failure` says why, and `add_request`
    raises EngineDeadError. Takes the model folder and the `Config` fields as
    `LLM` does; EngineStartupError if the core cannot start.
    """

    def __init__(self, model: str, **kwargs):
        super().__init__(model, CoreProcessClient, **kwargs)
        self._lock = threading.Lock()  # the output processor and the streams
        self._streams: dict[str, RequestStream] = {}
        self._accepting = True
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._handle_outputs, name="nanovllm-outputs", daemon=True)
        self._thread.start()

    def add_request(self, prompt: Prompt | ProcessedPrompt, sampling_params: SamplingParams) -> RequestStream:
        """Queue a request and return its output stream; ValueError if it cannot be served."""
        return self.add_checked(*self.check(prompt, sampling_params))

    def check(
        self, prompt: Prompt | ProcessedPrompt, sampling_params: SamplingParams
    ) -> tuple[ProcessedPrompt, SamplingParams]:
        """The checked prompt and settings that `add_checked` takes; ValueError if the request cannot be
        served. A caller that queues several prompts together checks them all first."""
        return self._check(prompt, sampling_params)

    def add_checked(self, prompt: ProcessedPrompt, params: SamplingParams) -> RequestStream:
        """Queue a request that `check` returned (it is not checked again) and return its output stream."""
        with self._lock:
            if self.failure is not None:
                raise EngineDeadError(self.failure)
            if not self._accepting:
                raise EngineDeadError("the engine is shutting down")
            parent = self._submit(prompt, params)
            stream = RequestStream(parent.request_id, len(prompt.token_ids))
            self._streams[parent.request_id] = stream
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (no-op if it already finished); its stream ends with "abort"."""
        with self._lock:
            if self.failure is not None:
                return
            state = self._abort(request_id)
            if state is not None:
                self._deliver([state])

    def stop_accepting(self) -> None:
        """Refuse new requests from now on (EngineDeadError); those already running go on."""
        with self._lock:
            self._accepting = False

    @property
    def healthy(self) -> bool:
        """Whether the engine takes new requests: its core lives and it is not shutting down."""
        return self.failure is None and self._accepting

    def stats(self) -> EngineStats:
        """Requests running and waiting in the core and the KV-cache fraction in use."""
        return self.client.stats()

    def shutdown(self) -> None:
        """Stop the core and the output thread; every unfinished request ends with "abort"."""
        self.stop_accepting()
        self.client.shutdown()
        self._thread.join()
        self.end_all("abort")
        unfreeze_objects()

    def end_all(self, reason: str, error: str | None = None) -> None:
        """End every live request with `reason` ("abort", or "error" saying why in `error`)."""
        with self._lock:
            ended = []
            for request_id, stream in list(self._streams.items()):
                parent, dropped = self.output_processor.finish(request_id, reason)
                self._drop(dropped)
                stream.error = error
                ended.append(parent)
            self._deliver([parent for parent in ended if parent is not None])

    def _handle_outputs(self) -> None:
        try:
            while (outputs := self.client.get_outputs()) is not None:
                with self._lock:
                    processed = self.output_processor.process(outputs)
                    if processed.to_abort:
                        self.client.abort(processed.to_abort)
                    self._deliver(processed.updated)
        except EngineDeadError as e:
            self._fail(str(e), f"the engine failed while running this request ({e})")
        except Exception as e:
            # a fault of the front end's own: nothing more would be delivered, so the server must stop
            logger.exception("the output thread failed")
            self._fail(
                f"the output thread failed ({type(e).__name__}: {e})", "the server failed while running this request"
            )

    def _fail(self, failure: str, error: str) -> None:
        """The engine cannot go on: refuse new requests and end the live ones with an error."""
        with self._lock:
            self.failure = failure
        self.end_all("error", error)

    def _deliver(self, parents: list[ParentRequest]) -> None:
        # One wake-up per event loop per step, not one per request.
        by_loop: dict = {}
        for parent in parents:
            output = self._delta(parent)
            stream = self._streams.get(parent.request_id)
            if output is None or stream is None:
                continue
            if output.finished:
                del self._streams[parent.request_id]
                if stream.error is None and any(c.finish_reason == "error" for c in output.outputs):
                    stream.error = "the server failed while running this request"
            if stream.loop is None:
                stream.put(output)
            else:
                by_loop.setdefault(stream.loop, []).append((stream, output))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:
                pass  # the loop has closed; nobody is reading these streams any more

    def _drop(self, core_request_ids: list[str]) -> None:
        """Drop these requests in the core, if it still runs."""
        if core_request_ids:
            with suppress(EngineDeadError):
                self.client.abort(core_request_ids)

    def _delta(self, parent: ParentRequest) -> RequestOutput | None:
        """What is new in `parent`; if that cannot be built, the request ends with an error instead."""
        try:
            return parent.delta()
        except Exception:
            logger.exception("building the output of request %s failed; it ends with an error", parent.request_id)
            self._drop(self.output_processor.finish(parent.request_id, "error")[1])
            ended = [CompletionOutput(c.index, "", [], None, None, "error") for c in parent.completions]
            return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, None, ended, True)


def _put_all(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, output in items:
        stream.put(output)
