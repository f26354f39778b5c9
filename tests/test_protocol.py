"""OpenAI request bodies: what reaches SamplingParams, prompt shapes, chat messages, response shapes."""

import pydantic
import pytest

from nanovllm.entrypoints.protocol import (ChatCompletionRequest, CompletionRequest, ResponseHeader, Usage,
                                           chat_choice, completion_choice)


def test_sampling_params_take_only_the_fields_sent():
    request = CompletionRequest(model="m", prompt="hi", temperature=0, stop="x", top_k=5, seed=7)
    params = request.sampling_params(default_max_tokens=16)
    assert (params.temperature, params.stop, params.top_k, params.seed) == (0, ["x"], 5, 7)
    assert params.max_tokens == 16 and params.top_p == 1.0 and params.ignore_eos is False
    assert CompletionRequest(model="m", prompt="hi", max_tokens=3).sampling_params(16).max_tokens == 3


def test_bad_values_are_value_errors_from_sampling_params():
    with pytest.raises(ValueError, match="n=1"):
        CompletionRequest(model="m", prompt="hi", n=3).sampling_params(16)
    with pytest.raises(ValueError, match="top_p"):
        CompletionRequest(model="m", prompt="hi", top_p=1.5).sampling_params(16)


def test_unknown_fields_and_wrong_types_are_refused():
    with pytest.raises(pydantic.ValidationError, match="best_of"):
        CompletionRequest(model="m", prompt="hi", best_of=2)
    with pytest.raises(pydantic.ValidationError, match="max_tokens"):
        CompletionRequest(model="m", prompt="hi", max_tokens="lots")


@pytest.mark.parametrize("prompt, expected", [("hi", "hi"), ([3, 4], [3, 4]), (["hi"], "hi"), ([[3, 4]], [3, 4])])
def test_single_prompt_unwraps_a_batch_of_one(prompt, expected):
    assert CompletionRequest(model="m", prompt=prompt).single_prompt() == expected


def test_a_batch_of_prompts_is_refused():
    with pytest.raises(ValueError, match="one prompt per request"):
        CompletionRequest(model="m", prompt=["a", "b"]).single_prompt()


def test_chat_max_completion_tokens_and_text_parts():
    request = ChatCompletionRequest(model="m", max_completion_tokens=9, messages=[
        {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}], "name": "u"}])
    assert request.sampling_params(default_max_tokens=100).max_tokens == 9
    assert request.messages[0].for_template() == {"role": "user", "content": "a b", "name": "u"}
    both = ChatCompletionRequest(model="m", max_tokens=4, max_completion_tokens=9, messages=[])
    assert both.sampling_params(100).max_tokens == 4
    assert ChatCompletionRequest(model="m", messages=[]).sampling_params(100).max_tokens == 100


def test_response_shapes():
    header = ResponseHeader.new("cmpl", "m")
    assert header.id.startswith("cmpl-") and header.model == "m"
    body = header.body("text_completion", [completion_choice("hi", "stop", False, False)], Usage.of(2, 3))
    assert body["choices"][0]["text"] == "hi" and body["usage"]["total_tokens"] == 5
    assert chat_choice("hi", None, True, True)["delta"] == {"role": "assistant", "content": "hi"}
    assert chat_choice("hi", None, True, False)["delta"] == {"content": "hi"}
    assert chat_choice("hi", "length", False, False)["message"] == {"role": "assistant", "content": "hi"}
