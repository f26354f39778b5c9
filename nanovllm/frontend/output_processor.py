"""The front end's side of each request: text, stop strings and what a stream may show so far."""

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from nanovllm.engine.messages import EngineCoreOutput
from nanovllm.frontend.detokenizer import IncrementalDetokenizer
from nanovllm.sampling_params import SamplingParams


@dataclass
class RequestOutput:
    """What a request gained since its previous output: new tokens and text, and whether it is done.

    `finish_reason` is set on the last output: "stop" (an end-of-sequence or stop token, or a stop string), "length"
    (max_tokens or max_model_len), "abort" (cancelled) or "error" (the step failed).
    """

    request_id: str
    token_ids: list[int]
    text: str
    num_prompt_tokens: int
    num_completion_tokens: int
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestState:
    """One request as the front end sees it: the completion so far as token ids and text.

    `text` is cut at a stop string once one appears; `stream_text` is what may
    be shown before the request ends, less a tail that may still turn out to
    be the start of a stop string.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 tokenizer: PreTrainedTokenizerBase | None):
        self.request_id = request_id
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.detokenizer = None if tokenizer is None else IncrementalDetokenizer(
            tokenizer, prompt_token_ids, params.skip_special_tokens)
        self.token_ids: list[int] = []
        self.logprobs: list[dict[int, float]] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.num_cached_tokens = 0
        self._num_sent_tokens = 0
        self._num_sent_chars = 0
        # characters a stream holds back: the longest stop string, less one
        self._held = max(map(len, params.stop), default=1) - 1

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def stream_text(self) -> str:
        if self.finished or not self._held:
            return self.text
        return self.text[: max(len(self.text) - self._held, 0)]

    def update(self, output: EngineCoreOutput) -> bool:
        """Take one step's output from the core; True if a stop string finished the request
        (which the core does not know about)."""
        self.token_ids += output.new_token_ids
        if output.new_logprobs:
            self.logprobs += output.new_logprobs
        self.num_cached_tokens = output.num_cached_tokens
        reason = output.finish_reason
        stopped_by_string = False
        if self.detokenizer is not None and output.new_token_ids:
            params = self.params
            new_ids = output.new_token_ids
            if reason == "stop" and not params.include_stop_str_in_output:
                new_ids = new_ids[:-1]  # the core stopped on this token: its text stays out
            delta = self.detokenizer.step(new_ids)
            self.text += delta
            if (reason != "stop" and params.stop and delta and len(self.token_ids) >= params.min_tokens
                    and self._cut_at_stop_string(len(delta))):
                reason, stopped_by_string = "stop", True
        self.finish_reason = reason
        return stopped_by_string

    def _cut_at_stop_string(self, num_new_chars: int) -> bool:
        """Cut the text at the earliest stop string that the new characters complete; True if one did."""
        text = self.text
        found = []
        for stop in self.params.stop:
            # only a match that ends within the new characters is new
            start = max(len(text) - num_new_chars - len(stop) + 1, 0)
            index = text.find(stop, start)
            if index >= 0:
                found.append((index, stop))
        if not found:
            return False
        index, stop = min(found)
        self.text = text[: index + len(stop) if self.params.include_stop_str_in_output else index]
        return True

    def delta(self) -> RequestOutput:
        """The tokens and the showable text gained since the previous delta."""
        text = self.stream_text
        output = RequestOutput(self.request_id, self.token_ids[self._num_sent_tokens:],
                               text[self._num_sent_chars:], self.num_prompt_tokens, len(self.token_ids),
                               self.finish_reason)
        self._num_sent_tokens = len(self.token_ids)
        self._num_sent_chars = len(text)
        return output


@dataclass
class ProcessedOutputs:
    """The requests one step's outputs changed, and those a stop string ended, which the core must drop."""

    updated: list[RequestState]
    to_abort: list[str]


class OutputProcessor:
    """Keeps the state of every live request and folds the core's outputs into it."""

    def __init__(self):
        self.requests: dict[str, RequestState] = {}

    def add_request(self, state: RequestState) -> None:
        self.requests[state.request_id] = state

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def finish(self, request_id: str, reason: str) -> RequestState | None:
        """End a live request from the front end ("abort", "error"); None if it already ended."""
        state = self.requests.pop(request_id, None)
        if state is not None:
            state.finish_reason = reason
        return state

    def process(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        """Fold in one step's outputs; outputs of requests that already ended are dropped."""
        updated, to_abort = [], []
        for output in outputs:
            state = self.requests.get(output.request_id)
            if state is None:
                continue
            if state.update(output):
                to_abort.append(output.request_id)
            if state.finished:
                del self.requests[output.request_id]
            updated.append(state)
        return ProcessedOutputs(updated, to_abort)
