"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of a request's last n tokens."""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from nanovllm.spec_decode.proposer import Proposer

_NO_TOKEN = -1  # pads the contexts on the left; token ids are >= 0
_NO_MATCH = -2  # pads the suffixes, so that padding never matches padding


class NgramProposer(Proposer):
    """For each request, the longest n in [`min_n`, `max_n`] such that its last n tokens occurred before
    (the latest such occurrence), and up to `max_drafts` (at most `num_speculative_tokens`) tokens that
    followed it there.

    The batch is searched at once: contexts are right-aligned in one array, and
    every earlier window of `max_n` tokens is compared with the request's last
    `max_n` tokens; a window's match length is how many of its trailing tokens
    agree. There is no Python loop over tokens (only over requests, to copy
    their ids in, and over the offsets 1..max_n).
    """

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int):
        assert 1 <= min_n <= max_n
        self.num_speculative_tokens = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        """The tokens after each request's best match (`request_ids` are not needed: a lookup keeps no state)."""
        if not token_ids:
            return []
        width = max(len(ids) for ids in token_ids) + self.max_n - 1
        # contexts: [requests, width], right-aligned; the left padding lets a match start at the first token
        contexts = np.full((len(token_ids), width), _NO_TOKEN, dtype=np.int64)
        for row, ids in enumerate(token_ids):
            contexts[row, width - len(ids) :] = ids
        suffixes = contexts[:, -self.max_n :]  # [requests, max_n]
        suffixes = np.where(suffixes == _NO_TOKEN, _NO_MATCH, suffixes)
        # windows[r, e]: the max_n tokens that end just before column e + max_n, every window ending before the
        # last token: [requests, width - max_n, max_n]
        windows = sliding_window_view(contexts[:, :-1], self.max_n, axis=1)
        # [requests, windows]: how many trailing tokens match, grown one offset from the end at a time (a loop
        # over n, not over tokens), so that no [requests, windows, max_n] array is made
        lengths = np.zeros(windows.shape[:2], dtype=np.int32)
        matching = np.ones(windows.shape[:2], dtype=bool)
        for back in range(1, self.max_n + 1):
            matching &= windows[:, :, -back] == suffixes[:, None, -back]
            lengths += matching
        # prefer the longest match, then the latest: a score that orders by length, then by end column
        ends = np.arange(windows.shape[1])
        scores = np.where(lengths >= self.min_n, lengths * width + ends, -1)
        best = scores.argmax(axis=1)  # [requests]
        found = scores[np.arange(len(token_ids)), best] >= 0
        proposals = []
        for row, ids in enumerate(token_ids):
            num_drafts = min(max_drafts[row], self.num_speculative_tokens)
            if not found[row] or num_drafts <= 0:
                proposals.append([])
                continue
            # the window ends at column best + max_n of the padded row; the tokens from there follow it
            start = int(best[row]) + self.max_n - (width - len(ids))
            proposals.append(ids[start : start + num_drafts])
        return proposals
