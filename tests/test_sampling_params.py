"""SamplingParams: vLLM's defaults, normalised stop fields, and a clear error for every bad value."""

import pytest

from nanovllm import SamplingParams


def test_defaults_turn_everything_off():
    params = SamplingParams()
    assert (params.temperature, params.max_tokens, params.ignore_eos, params.n, params.best_of) == (
        1.0,
        16,
        False,
        1,
        None,
    )
    assert (params.logit_bias, params.prompt_logprobs) == (None, None)
    assert (params.top_k, params.top_p, params.min_p, params.seed) == (-1, 1.0, 0.0, None)
    assert (params.stop, params.stop_token_ids, params.min_tokens, params.logprobs) == ([], [], 0, None)
    assert not params.has_penalties and not params.is_greedy


def test_one_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b"), stop_token_ids=(3,)).stop_token_ids == [3]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be"),
        ({"n": 2.0}, "n must be"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"best_of": 2, "temperature": 0}, "best_of > 1 needs sampling"),
        ({"prompt_logprobs": -2}, r"prompt_logprobs must be None, an integer >= 0 .* or -1 \(the whole vocabulary\)"),
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"max_tokens": None, "min_tokens": -1}, "min_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.1}, "min_p"),
        ({"seed": 1.5}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", 3]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"skip_special_tokens": None}, "skip_special_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
        ({"logprobs": -2}, "logprobs"),
        ({"logprobs": 2.0}, "logprobs"),
    ],
)
def test_bad_values_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_off_values_and_edges_are_allowed():
    params = SamplingParams(
        temperature=0,
        top_k=0,
        top_p=1,
        min_p=1,
        seed=-5,
        repetition_penalty=0.1,
        presence_penalty=-2,
        frequency_penalty=2,
        min_tokens=64,
        max_tokens=64,
        logprobs=0,
        prompt_logprobs=0,
        n=4,
        logit_bias={3: -100, 4: 100.0},
    )
    assert params.is_greedy and params.has_penalties and params.num_completions == 4
    assert SamplingParams(max_tokens=None, min_tokens=10_000).max_tokens is None
    assert SamplingParams(n=2, best_of=5).num_completions == 5


def test_an_unknown_keyword_is_a_value_error_that_names_it():
    with pytest.raises(ValueError, match="unknown sampling parameter.*foo"):
        SamplingParams(foo=1, temperature=0.5)


def test_from_dict_names_unknown_keys():
    assert SamplingParams.from_dict({"top_k": 5}).top_k == 5
    with pytest.raises(ValueError, match="unknown sampling parameter.*top_q"):
        SamplingParams.from_dict({"top_q": 0.5})
