"""SamplingParams validation."""

import pytest

from nanovllm import SamplingParams


def test_defaults():
    params = SamplingParams()
    assert (params.temperature, params.max_tokens, params.ignore_eos) == (1.0, 64, False)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
])
def test_bad_values_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_zero_temperature_is_greedy_and_allowed():
    assert SamplingParams(temperature=0).temperature == 0
