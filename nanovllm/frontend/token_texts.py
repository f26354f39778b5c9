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
        """Decode the ids not seen before, each once, in one call (a list of sequences gives a list of texts)."""
        new = [token_id for token_id in dict.fromkeys(token_ids) if token_id not in self._texts]
        self._texts.update(zip(new, self._tokenizer.decode([[token_id] for token_id in new])))
