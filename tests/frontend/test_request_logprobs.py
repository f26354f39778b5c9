"""RequestLogprobs: each position a {token id: Logprob} dict with the values and token texts it came with,
the chosen token first, in order; out of the cycle collector's reach."""

import gc
import math

from nanovllm.engine.messages import TokenLogprobs
from nanovllm.frontend.request_logprobs import RequestLogprobs
from nanovllm.frontend.token_texts import TokenTexts
from nanovllm.outputs import Logprob

ENTRIES = [
    TokenLogprobs([6, 6, 9], [-0.1, -0.1, -1.5], 1),  # the chosen token is also the most likely
    TokenLogprobs([9, 7, 8], [-2.0, -0.5, -1.0], 3),
    TokenLogprobs([511, 2, 3], [-math.inf, -1e-9, -123.456789012345], 151_936),
]


def expected(decode) -> list[dict]:
    return [
        {6: Logprob(-0.1, 1, decode(6)), 9: Logprob(-1.5, 2, decode(9))},
        {9: Logprob(-2.0, 3, decode(9)), 7: Logprob(-0.5, 1, decode(7)), 8: Logprob(-1.0, 2, decode(8))},
        {
            511: Logprob(-math.inf, 151_936, decode(511)),
            2: Logprob(-1e-9, 1, decode(2)),
            3: Logprob(-123.456789012345, 2, decode(3)),
        },
    ]


def test_positions_are_made_as_they_come_the_chosen_token_first(tiny_tokenizer):
    decode = lambda token_id: tiny_tokenizer.decode([token_id])
    logprobs = RequestLogprobs(TokenTexts(tiny_tokenizer))
    read_first = logprobs.positions
    for n, entry in enumerate(ENTRIES, start=1):
        logprobs.add(entry)
        assert logprobs.positions == expected(decode)[:n]
    # the list read first has grown with the later positions, and the chosen token leads each position
    assert read_first is logprobs.positions
    assert [list(position) for position in read_first] == [[6, 9], [9, 7, 8], [511, 2, 3]]
    # numbers and text only: neither the positions nor their Logprobs are walked by the cycle collector
    assert not any(gc.is_tracked(position) for position in read_first)
    assert not gc.is_tracked(read_first[0][6])


def test_leading_entries_come_first_and_no_token_texts_give_no_text():
    logprobs = RequestLogprobs(None, leading=(None,))
    assert logprobs.positions == [None]
    for entry in ENTRIES:
        logprobs.add(entry)
    assert logprobs.positions == [None, *expected(lambda token_id: None)]
