"""Incremental detokenization: one request's completion text, grown a few tokens at a time."""

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

# Prompt tokens the stream starts from, so that the first piece of text carries
# the spacing it has after the prompt.
_CONTEXT_TOKENS = 8
_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Turns a request's new token ids into text deltas with the `tokenizers` library's DecodeStream.

    The stream holds back the bytes of a character split across tokens until
    its last token arrives, and skips special tokens (if asked) without eating
    the next word's leading space. A prompt that ends inside a character keeps
    that character's first tokens out of the stream's start: they go in with
    the first completion tokens, so the character the completion finishes
    comes out whole and no prompt text comes with it.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ):
        self._tokenizer = tokenizer.backend_tokenizer
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        split = len(context)
        while split and self._tokenizer.decode(context[:split], skip_special_tokens).endswith(_INCOMPLETE):
            split -= 1
        self._pending = context[split:]
        self._stream = DecodeStream(ids=context[:split], skip_special_tokens=skip_special_tokens)

    def step(self, token_ids: list[int]) -> str:
        """The text the new tokens add; "" while it ends in an incomplete character."""
        if not token_ids:
            return ""
        if self._pending:
            token_ids, self._pending = self._pending + token_ids, []
        return self._stream.step(self._tokenizer, token_ids) or ""
