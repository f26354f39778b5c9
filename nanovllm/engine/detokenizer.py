"""Incremental detokenization: a sequence's text, grown a token at a time."""

from transformers import PreTrainedTokenizerBase

# Prompt tokens decoded before the first completion token, so that the first
# piece of text carries the spacing it has after the prompt.
_CONTEXT_TOKENS = 5
_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Turns one sequence's growing token list into text deltas.

    Each call decodes only a short window: the text of tokens
    `[prefix_offset, len)` minus the text of `[prefix_offset, read_offset)`,
    which is already out. Decoding a window rather than single tokens keeps
    word boundaries right; holding back a delta that ends in U+FFFD keeps a
    multi-byte character split across tokens from coming out broken: it comes
    out whole once its last token arrives.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, num_prompt_tokens: int,
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.prefix_offset = max(num_prompt_tokens - _CONTEXT_TOKENS, 0)
        self.read_offset = num_prompt_tokens

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def step(self, token_ids: list[int], end: int | None = None) -> str:
        """New text for tokens up to `end` (all by default) of the whole list, prompt included.

        Returns "" while the text ends in an incomplete character; a sequence
        that finishes in the middle of one never shows it.
        """
        end = len(token_ids) if end is None else end
        prefix = self._decode(token_ids[self.prefix_offset : self.read_offset])
        delta = self._decode(token_ids[self.prefix_offset : end])[len(prefix) :]
        if delta.endswith(_INCOMPLETE):
            return ""
        if delta:
            self.prefix_offset = self.read_offset
        # else only skipped special tokens came: the window keeps the text before them,
        # which the next token's leading space is decoded against
        self.read_offset = end
        return delta
