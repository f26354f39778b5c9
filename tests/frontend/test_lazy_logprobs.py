"""LazyLogprobs: positions kept as they come and built into {token id: Logprob} dicts when read, with the
values and token texts they came with, in order, however the reads fall between the additions."""

import math

from nanovllm.engine.messages import TokenLogprobs
from nanovllm.frontend.lazy_logprobs import LazyLogprobs
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


def test_positions_read_at_once_or_between_additions_are_the_same_list(tiny_tokenizer):
    decode = lambda token_id: tiny_tokenizer.decode([token_id])
    at_once = LazyLogprobs(TokenTexts(tiny_tokenizer))
    for entry in ENTRIES:
        at_once.add(entry)
    assert at_once.built() == expected(decode)

    step_by_step = LazyLogprobs(TokenTexts(tiny_tokenizer))
    first_read = step_by_step.built()
    assert first_read == []
    for n, entry in enumerate(ENTRIES, start=1):
        step_by_step.add(entry)
        assert step_by_step.built() == expected(decode)[:n]
    # the list read first has grown with the later positions, and the chosen token leads each position
    assert first_read is step_by_step.built()
    assert [list(position) for position in first_read] == [[6, 9], [9, 7, 8], [511, 2, 3]]


def test_leading_entries_come_first_and_no_token_texts_give_no_text():
    logprobs = LazyLogprobs(None, leading=(None,))
    assert logprobs.built() == [None]
    for entry in ENTRIES:
        logprobs.add(entry)
    assert logprobs.built() == [None, *expected(lambda token_id: None)]
