"""OpenAI request bodies and response pieces: what reaches SamplingParams, prompt batches, unknown fields,
chat options, and the logprobs objects of both endpoints."""

import pydantic
import pytest

from nanovllm.entrypoints.protocol import (ChatCompletionRequest, CompletionRequest, ResponseHeader, Usage,
                                           chat_logprobs, completion_logprobs)
from nanovllm.outputs import Logprob


def test_sampling_params_take_only_the_fields_sent():
    request = CompletionRequest(model="m", prompt="hi", temperature=0, stop="x", top_k=5, seed=7, n=2)
    params = request.sampling_params(logprobs=None)
    assert (params.temperature, params.stop, params.top_k, params.seed, params.n) == (0, ["x"], 5, 7, 2)
    assert params.max_tokens is None and params.top_p == 1.0 and params.ignore_eos is False
    assert CompletionRequest(model="m", prompt="hi", max_tokens=3).sampling_params(None).max_tokens == 3


def test_logprobs_best_of_and_logit_bias_reach_sampling_params():
    request = CompletionRequest(model="m", prompt="hi", temperature=1, n=2, best_of=3,
                                logit_bias={"17": -100, "5": 2.5})
    params = request.sampling_params(logprobs=2, prompt_logprobs=2, best_of=request.best_of)
    assert (params.logprobs, params.prompt_logprobs, params.best_of) == (2, 2, 3)
    assert params.logit_bias == {17: -100, 5: 2.5}
    with pytest.raises(ValueError, match="logit_bias keys must be token ids"):
        CompletionRequest(model="m", prompt="hi", logit_bias={"the": 1}).sampling_params(None)
    with pytest.raises(ValueError, match="logit_bias"):
        CompletionRequest(model="m", prompt="hi", logit_bias={"3": 101}).sampling_params(None)


def test_bad_values_are_value_errors_from_sampling_params():
    with pytest.raises(ValueError, match="n must be"):
        CompletionRequest(model="m", prompt="hi", n=0).sampling_params(None)
    with pytest.raises(ValueError, match="top_p"):
        CompletionRequest(model="m", prompt="hi", top_p=1.5).sampling_params(None)


def test_unknown_fields_are_kept_aside_and_known_ones_stay_strict():
    request = CompletionRequest(model="m", prompt="hi", suffix="!", frobnicate=3, logit_bias=None)
    assert request.unknown_fields == ["frobnicate", "suffix"]
    assert "frobnicate" not in request.sampling_params(None).__dict__
    with pytest.raises(pydantic.ValidationError, match="max_tokens"):
        CompletionRequest(model="m", prompt="hi", max_tokens="lots")
    assert ChatCompletionRequest(model="m", messages=[], logprobs=False).unknown_fields == []


@pytest.mark.parametrize("prompt, expected", [("hi", ["hi"]), ([3, 4], [[3, 4]]), (["hi", "yo"], ["hi", "yo"]),
                                              ([[3, 4], [5]], [[3, 4], [5]])])
def test_prompts_are_one_or_a_batch(prompt, expected):
    assert CompletionRequest(model="m", prompt=prompt).prompts() == expected


def test_chat_max_completion_tokens_takes_precedence_and_text_parts_join():
    request = ChatCompletionRequest(model="m", max_completion_tokens=9, messages=[
        {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}], "name": "u"}])
    assert request.sampling_params(None).max_tokens == 9
    assert request.conversation() == [{"role": "user", "content": "a b", "name": "u"}]
    both = ChatCompletionRequest(model="m", max_tokens=4, max_completion_tokens=9, messages=[])
    assert both.sampling_params(None).max_tokens == 9
    assert ChatCompletionRequest(model="m", max_tokens=4, messages=[]).sampling_params(None).max_tokens == 4
    assert ChatCompletionRequest(model="m", messages=[]).sampling_params(None).max_tokens is None


def test_response_header_and_usage():
    header = ResponseHeader.new("cmpl", "m")
    assert header.id.startswith("cmpl-") and header.model == "m"
    body = header.body("text_completion", [{"index": 0}], Usage.of(2, 3))
    assert body["object"] == "text_completion" and body["usage"]["total_tokens"] == 5


def test_completion_logprobs_list_text_values_alternatives_and_offsets():
    positions = [None, {7: Logprob(-0.5, 2, " b"), 9: Logprob(-0.2, 1, " c")}, {8: Logprob(-1.0, 1, "d")}]
    out = completion_logprobs([5, 7, 8], positions, start_offset=10, decode=lambda t: "a")
    assert out["tokens"] == ["a", " b", "d"]
    assert out["token_logprobs"] == [None, -0.5, -1.0]
    assert out["top_logprobs"] == [None, {" b": -0.5, " c": -0.2}, {"d": -1.0}]
    assert out["text_offset"] == [10, 11, 13]


def test_chat_logprobs_give_the_top_k_by_rank_with_bytes():
    position = {7: Logprob(-2.0, 3, "é"), 9: Logprob(-0.2, 1, "x"), 4: Logprob(-0.9, 2, "y")}
    [entry] = chat_logprobs([7], [position], top=2)["content"]
    assert (entry["token"], entry["logprob"], entry["bytes"]) == ("é", -2.0, [0xC3, 0xA9])
    assert [t["token"] for t in entry["top_logprobs"]] == ["x", "y"]
    assert chat_logprobs([7], [position], top=0)["content"][0]["top_logprobs"] == []
