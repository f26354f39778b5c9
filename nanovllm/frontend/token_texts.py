"""Each token's text on its own, as logprobs show it: decoded once per token id, then looked up."""

from transformers import PreTrainedTokenizerBase


class TokenTexts:
    """The text `tokenizer.decode([token_id])` gives each token id, kept once decoded.

    A step with logprobs=k names 1 + k tokens per row, and decoding each with
    a call of its own costs several microseconds in transformers: for 256 rows
    that was more host time than the device's step. The vocabulary is fixed,
    so each id is decoded once for the front end's whole life (ids not seen
    before in one batched call) and a dictionary look-up gives it after that.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_ids: list[int]) -> list[str]:
        """The text of each of `token_ids`, in order."""
        try:
            return [self._texts[token_id] for token_id in token_ids]
        except KeyError:
            self._decode_new(token_ids)
            return [self._texts[token_id] for token_id in token_ids]

    def _decode_new(self, token_ids: list[int]) -> None:
        """Decode the ids not seen before, each once, in one call."""
        new = [token_id for token_id in dict.fromkeys(token_ids) if token_id not in self._texts]
        self._texts.update(zip(new, self._decode_each([[token_id] for token_id in new])))

    def _decode_each(self, sequences: list[list[int]]) -> list[str]:
        """The text of each one-token sequence, as `tokenizer.decode` gives it. A fast tokenizer's own
        batch decode gives the same text (unless the tokenizer cleans up spaces after decoding) in a
        fraction of the time: transformers' decode walks each sequence in Python first, which for the
        first steps of a batch with logprobs (thousands of new ids) cost more than the device's step."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(self._tokenizer, "clean_up_tokenization_spaces", False):
            return self._tokenizer.decode(sequences)
        return backend.decode_batch(sequences, skip_special_tokens=False)
