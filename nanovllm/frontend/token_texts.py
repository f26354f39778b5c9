"""Each token's text on its own, as logprobs show it: decoded once per token id, then looked up."""

import threading

from transformers import PreTrainedTokenizerBase


class TokenTexts:
    """The text `tokenizer.decode([token_id])` gives each token id, kept once decoded.

    A step with logprobs=k names 1 + k tokens per row, and decoding each with
    a call of its own would take a large batch more host time than the
    device's step. The vocabulary is fixed, so each id is decoded once for the
    front end's whole life. With a fast tokenizer and the model's `vocab_size`,
    a background thread decodes the whole vocabulary in one call from
    construction on (the tokenizers library leaves the GIL while it decodes),
    and `whole_vocabulary` is set once it is done. Until then, and without it, ids
    not seen before are decoded in one batched call per call and kept.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._vocabulary: list[str] | None = None  # every id's text, once the background decode is done
        self.whole_vocabulary = threading.Event()
        if vocab_size and self._fast_backend() is not None:
            threading.Thread(target=self._decode_vocabulary, args=(vocab_size,), daemon=True).start()

    def __call__(self, token_ids: list[int]) -> list[str]:
        """The text of each of `token_ids`, in order."""
        vocabulary = self._vocabulary
        if vocabulary is not None:
            return [vocabulary[token_id] for token_id in token_ids]
        try:
            return [self._texts[token_id] for token_id in token_ids]
        except KeyError:
            self._decode_new(token_ids)
            return [self._texts[token_id] for token_id in token_ids]

    def _decode_vocabulary(self, vocab_size: int) -> None:
        self._vocabulary = self._decode_each([[token_id] for token_id in range(vocab_size)])
        self.whole_vocabulary.set()

    def _decode_new(self, token_ids: list[int]) -> None:
        """Decode the ids not seen before, each once, in one call."""
        new = [token_id for token_id in dict.fromkeys(token_ids) if token_id not in self._texts]
        self._texts.update(zip(new, self._decode_each([[token_id] for token_id in new])))

    def _fast_backend(self):
        """The tokenizers library's tokenizer behind a fast tokenizer whose decode gives the same text as it
        (one that cleans up spaces after decoding does not); else None."""
        if getattr(self._tokenizer, "clean_up_tokenization_spaces", False):
            return None
        return getattr(self._tokenizer, "backend_tokenizer", None)

    def _decode_each(self, sequences: list[list[int]]) -> list[str]:
        """The text of each one-token sequence, as `tokenizer.decode` gives it: through the fast tokenizer's
        own batch decode where it gives the same text, as transformers' decode first walks every sequence
        in Python."""
        backend = self._fast_backend()
        if backend is None:
            return self._tokenizer.decode(sequences)
        return backend.decode_batch(sequences, skip_special_tokens=False)
