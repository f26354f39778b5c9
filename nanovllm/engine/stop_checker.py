"""After each new token: grow the sequence's text and decide whether it is done, and why."""

from nanovllm.engine.sequence import Sequence
from nanovllm.sampling_params import SamplingParams


class StopChecker:
    """Applies a request's stopping rules: stop tokens, stop strings, min/max tokens, model length."""

    def __init__(self, eos_token_ids: frozenset[int], max_model_len: int):
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def update(self, seq: Sequence) -> None:
        """Extend `seq.output_text` by its last token and set `seq.finish_reason` if it is done."""
        params = seq.params
        num_completion_tokens = seq.num_completion_tokens
        may_stop = num_completion_tokens >= params.min_tokens
        reason = None
        if may_stop and self._is_stop_token(seq.last_token, params):
            reason = "stop"
        elif num_completion_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        if seq.detokenizer is not None:
            # a stop token's own text stays out unless asked for
            keep_last = reason != "stop" or params.include_stop_str_in_output
            end = seq.num_tokens if keep_last else seq.num_tokens - 1
            delta = seq.detokenizer.step(seq.token_ids, end)
            seq.output_text += delta
            if reason != "stop" and may_stop and delta and self._cut_at_stop_string(seq, len(delta)):
                reason = "stop"
        seq.finish_reason = reason

    def _is_stop_token(self, token_id: int, params: SamplingParams) -> bool:
        return token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids)

    @staticmethod
    def _cut_at_stop_string(seq: Sequence, num_new_chars: int) -> bool:
        """Cut the text at the earliest stop string that the new characters complete; True if one did."""
        text = seq.output_text
        found = []
        for stop in seq.params.stop:
            # only a match that ends within the new characters is new
            start = max(len(text) - num_new_chars - len(stop) + 1, 0)
            index = text.find(stop, start)
            if index >= 0:
                found.append((index, stop))
        if not found:
            return False
        index, stop = min(found)
        seq.output_text = text[: index + len(stop) if seq.params.include_stop_str_in_output else index]
        return True
