"""Streamed text that may end in the first characters of a tag: a parser holds them back until the next
delta says whether the tag follows."""


def partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of `text` may be the start of `tag` (a strict prefix of it)."""
    return next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:k])), 0)
