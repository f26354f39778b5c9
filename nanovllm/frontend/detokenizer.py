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
        self._skip_special_tokens = skip_special_tokens
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
            token_ids = self._after_pending(token_ids)
        return self._stream.step(self._tokenizer, token_ids) or ""

    def _after_pending(self, token_ids: list[int]) -> list[int]:
        """The first completion tokens, after the prompt's unfinished character where they continue it.
        Where they begin a character of their own (the prompt's then never finishes), that character's
        bytes stay out: decoded with them they would put a replacement character into the completion."""
        pending, self._pending = self._pending, []
        decode = self._tokenizer.decode
        with_prompt_bytes = decode(pending + token_ids, self._skip_special_tokens)
        continues = not with_prompt_bytes.startswith(_INCOMPLETE) or decode(token_ids).startswith(_INCOMPLETE)
        return pending + token_ids if continues else token_ids
