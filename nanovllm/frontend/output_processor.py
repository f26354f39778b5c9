"""The front end's side of each request: text, stop strings, logprobs and what a stream may show so far."""

import logging
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from nanovllm.engine.messages import EngineCoreOutput, TokenLogprobs
from nanovllm.frontend.detokenizer import IncrementalDetokenizer
from nanovllm.frontend.request_logprobs import RequestLogprobs
from nanovllm.frontend.token_texts import TokenTexts
from nanovllm.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class RequestState:
    """One completion as the front end sees it: its tokens, text and logprobs so far.

    `text` is cut at a stop string once one appears; `stream_text` is what may
    be shown before the completion ends, less a tail that may still turn out
    to be the start of a stop string. `params` are the completion's own (the
    core request's); `show_logprobs` says whether the user asked for logprobs
    (a best_of ranking computes them without showing them). `token_texts`
    gives the logprobs' token texts (the front end's one, shared by all its
    requests; None without a tokenizer).
    """

    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: PreTrainedTokenizerBase | None,
        show_logprobs: bool,
        token_texts: TokenTexts | None,
    ):
        self.request_id = request_id
        self.index = index
        self.params = params
        self.detokenizer = (
            None
            if tokenizer is None
            else IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
        )
        self.token_ids: list[int] = []
        self.text = ""
        self.cumulative_logprob: float | None = None if params.logprobs is None else 0.0
        self._logprobs = RequestLogprobs(token_texts) if show_logprobs else None
        self._prompt_logprobs = (
            None if params.prompt_logprobs is None else RequestLogprobs(token_texts, leading=(None,))
        )
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_cached_tokens = 0
        self._num_sent_tokens = 0
        self._num_sent_chars = 0
        self._end_sent = False
        # characters a stream holds back: the longest stop string, less one
        self._held = max(map(len, params.stop), default=1) - 1

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def logprobs(self) -> list[PositionLogprobs] | None:
        """Per completion token, {token id: Logprob} (None when not shown)."""
        return None if self._logprobs is None else self._logprobs.positions

    @property
    def prompt_logprobs(self) -> list[PositionLogprobs | None] | None:
        """None for the first prompt token, then per prompt token scored so far {token id: Logprob} (None
        when not asked for)."""
        return None if self._prompt_logprobs is None else self._prompt_logprobs.positions

    @property
    def stream_text(self) -> str:
        if self.finished or not self._held:
            return self.text
        return self.text[: max(len(self.text) - self._held, 0)]

    def update(self, output: EngineCoreOutput) -> bool:
        """Take one step's output from the core; True if a stop string finished the completion
        (which the core does not know about).

        Several new tokens (kept drafts of speculative decoding) are taken one at
        a time where stop strings are looked for, so that the completion ends at
        the token that completes one, as it would with one token per step; the
        tokens after it are dropped."""
        self.num_cached_tokens = output.num_cached_tokens
        for entry in output.new_prompt_logprobs or ():
            self._prompt_logprobs.add(entry)
        ids, logprobs = output.new_token_ids, output.new_logprobs
        if not (self.params.stop and self.detokenizer is not None and len(ids) > 1):
            return self._take(ids, logprobs, output.finish_reason, output.stop_reason)
        for i, token_id in enumerate(ids):
            last = i == len(ids) - 1
            new_logprobs = None if logprobs is None else logprobs[i : i + 1]
            if self._take(
                [token_id], new_logprobs, output.finish_reason if last else None, output.stop_reason if last else None
            ):
                return True
        return False

    def _take(
        self, new_ids: list[int], new_logprobs: list[TokenLogprobs] | None, reason: str | None, stop_reason: int | None
    ) -> bool:
        """Add new tokens, their logprobs and their text, then look for a stop string in that text."""
        self.token_ids += new_ids
        self._add_logprobs(new_logprobs)
        self.stop_reason = stop_reason
        stopped_by_string = False
        if self.detokenizer is not None and new_ids:
            params = self.params
            if reason == "stop" and not params.include_stop_str_in_output:
                new_ids = new_ids[:-1]  # the core stopped on this token: its text stays out
            delta = self.detokenizer.step(new_ids)
            self.text += delta
            if reason != "stop" and params.stop and delta and len(self.token_ids) >= params.min_tokens:
                stop = self._cut_at_stop_string(len(delta))
                if stop is not None:
                    reason, self.stop_reason, stopped_by_string = "stop", stop, True
        self.finish_reason = reason
        return stopped_by_string

    def _add_logprobs(self, new_logprobs: list[TokenLogprobs] | None) -> None:
        for entry in new_logprobs or ():
            self.cumulative_logprob += entry.logprobs[0]
            if self._logprobs is not None:
                self._logprobs.add(entry)

    def _cut_at_stop_string(self, num_new_chars: int) -> str | None:
        """Cut the text at the earliest stop string that the new characters complete; returns it, or None."""
        text = self.text
        found = []
        for stop in self.params.stop:
            # only a match that ends within the new characters is new
            start = max(len(text) - num_new_chars - len(stop) + 1, 0)
            index = text.find(stop, start)
            if index >= 0:
                found.append((index, stop))
        if not found:
            return None
        index, stop = min(found)
        self.text = text[: index + len(stop) if self.params.include_stop_str_in_output else index]
        return stop

    def completion(self, index: int | None = None) -> CompletionOutput:
        """Everything so far (numbered `index`, by default the completion's own)."""
        return CompletionOutput(
            self.index if index is None else index,
            self.text,
            list(self.token_ids),
            self.cumulative_logprob,
            self.logprobs,
            self.finish_reason,
            self.stop_reason,
        )

    def delta(self) -> CompletionOutput:
        """The tokens, showable text and logprobs gained since the previous delta."""
        text, first = self.stream_text, self._num_sent_tokens
        logprobs = None if self.logprobs is None else self.logprobs[first:]
        output = CompletionOutput(
            self.index,
            text[self._num_sent_chars :],
            self.token_ids[first:],
            self.cumulative_logprob,
            logprobs,
            self.finish_reason,
            self.stop_reason,
        )
        self._num_sent_tokens, self._num_sent_chars = len(self.token_ids), len(text)
        self._end_sent = self.finished
        return output

    @property
    def has_news(self) -> bool:
        """Whether a delta would carry something: new tokens, or the end not yet shown."""
        return len(self.token_ids) > self._num_sent_tokens or (self.finished and not self._end_sent)


class ParentRequest:
    """A user's request: one prompt and its n (or best_of) completions, each a core request of its own."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        completions: list[RequestState],
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.completions = completions
        self._prompt_logprobs_sent = False

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.completions)

    @property
    def ranks_completions(self) -> bool:
        """best_of > n: only the n best completions are shown, once all have ended."""
        return self.params.num_completions > self.params.n

    def _best(self) -> list[CompletionOutput]:
        ranked = sorted(self.completions, key=lambda c: -(c.cumulative_logprob or 0.0))
        return [c.completion(index) for index, c in enumerate(ranked[: self.params.n])]

    def output(self) -> RequestOutput:
        """Everything so far."""
        outputs = self._best() if self.ranks_completions else [c.completion() for c in self.completions]
        return self._request_output(outputs, self.completions[0].prompt_logprobs)

    def delta(self) -> RequestOutput | None:
        """What is new since the previous delta, None if nothing is (a best_of ranking shows nothing
        before its end, then everything)."""
        if self.ranks_completions:
            return self.output() if self.finished else None
        changed = [c.delta() for c in self.completions if c.has_news]
        if not changed:
            return None
        prompt_logprobs = None
        if not self._prompt_logprobs_sent and any(c.token_ids for c in changed):
            prompt_logprobs, self._prompt_logprobs_sent = self.completions[0].prompt_logprobs, True
        return self._request_output(changed, prompt_logprobs)

    def _request_output(self, outputs: list[CompletionOutput], prompt_logprobs) -> RequestOutput:
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            prompt_logprobs,
            outputs,
            self.finished,
            self.completions[0].num_cached_tokens,
        )


@dataclass
class ProcessedOutputs:
    """The user requests one step's outputs changed (in first-touched order), and the core requests a
    stop string ended, which the core must drop."""

    updated: list[ParentRequest]
    to_abort: list[str]


class OutputProcessor:
    """Keeps the state of every live request and folds the core's outputs into it."""

    def __init__(self):
        self.parents: dict[str, ParentRequest] = {}
        self._completions: dict[str, RequestState] = {}  # core request id -> its completion
        self._parent_of: dict[str, ParentRequest] = {}

    def add_request(self, parent: ParentRequest) -> None:
        self.parents[parent.request_id] = parent
        for completion in parent.completions:
            self._completions[completion.request_id] = completion
            self._parent_of[completion.request_id] = parent

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    def finish(self, request_id: str, reason: str) -> tuple[ParentRequest | None, list[str]]:
        """End a live user request from the front end ("abort", "error"): its unfinished completions
        end with `reason`. Returns it (None if it already ended) and the core requests to drop."""
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return None, []
        dropped = [c.request_id for c in parent.completions if not c.finished]
        for completion in parent.completions:
            if not completion.finished:
                completion.finish_reason = reason
            self._forget(completion.request_id)
        return parent, dropped

    def process(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        """Fold in one step's outputs; outputs of requests that already ended are dropped."""
        updated: dict[str, ParentRequest] = {}
        to_abort = []
        for output in outputs:
            completion = self._completions.get(output.request_id)
            if completion is None:
                continue
            parent = self._parent_of[output.request_id]
            updated[parent.request_id] = parent
            try:
                if completion.update(output):
                    to_abort.append(output.request_id)
            except Exception:
                # a fault in one request's text (detokenizer, stop strings) ends that request only
                logger.exception("processing the output of request %s failed; it ends with an error", parent.request_id)
                to_abort += self.finish(parent.request_id, "error")[1]
                continue
            if completion.finished:
                self._forget(output.request_id)
            if parent.finished:
                self.parents.pop(parent.request_id, None)
        return ProcessedOutputs(list(updated.values()), to_abort)

    def _forget(self, core_request_id: str) -> None:
        self._completions.pop(core_request_id, None)
        self._parent_of.pop(core_request_id, None)
