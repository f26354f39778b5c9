"""OpenAI request bodies and response pieces: what reaches SamplingParams, prompt batches, unknown fields,
chat options, and the logprobs objects of both endpoints."""

import logging

import pydantic
import pytest

from nanovllm.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseHeader,
    Usage,
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs_json,
)
from nanovllm.frontend.chat import text_messages
from nanovllm.outputs import Logprob


def test_sampling_params_take_only_the_fields_sent():
    request = CompletionRequest(model="m", prompt="hi", temperature=0, stop="x", top_k=5, seed=7, n=2)
    params = request.sampling_params(logprobs=None)
    assert (params.temperature, params.stop, params.top_k, params.seed, params.n) == (0, ["x"], 5, 7, 2)
    assert params.top_p == 1.0 and params.ignore_eos is False
    assert CompletionRequest(model="m", prompt="hi", max_tokens=3).sampling_params(None).max_tokens == 3


def test_generation_config_defaults_fill_only_the_fields_left_out():
    defaults = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], top_k=5, temperature=0)
    params = request.sampling_params(None, defaults=defaults)
    assert (params.temperature, params.top_k, params.top_p) == (0, 5, 0.95)
    params = CompletionRequest(model="m", prompt="hi").sampling_params(None, defaults=defaults)
    assert (params.temperature, params.top_k, params.top_p) == (0.6, 20, 0.95)


def test_logprobs_best_of_and_logit_bias_reach_sampling_params():
    request = CompletionRequest(
        model="m", prompt="hi", temperature=1, n=2, best_of=3, logit_bias={"17": -100, "5": 2.5}
    )
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


def test_completions_default_to_16_tokens_and_chat_to_the_context():
    assert CompletionRequest(model="m", prompt="hi").sampling_params(None).max_tokens == 16
    assert CompletionRequest(model="m", prompt="hi", max_tokens=None).sampling_params(None).max_tokens == 16
    assert ChatCompletionRequest(model="m", messages=[]).sampling_params(None).max_tokens is None


def test_echo_with_max_tokens_0_scores_the_prompt_with_its_logprobs():
    scoring = CompletionRequest(prompt="hi", echo=True, max_tokens=0, logprobs=3)
    assert scoring.scores_prompt and scoring.sampling_params(3, scoring.prompt_logprobs_wanted()).max_tokens == 1
    assert scoring.prompt_logprobs_wanted() == 3
    assert not CompletionRequest(prompt="hi", max_tokens=0).scores_prompt
    assert CompletionRequest(prompt="hi", logprobs=3).prompt_logprobs_wanted() is None
    assert CompletionRequest(prompt="hi", prompt_logprobs=2, echo=True, logprobs=3).prompt_logprobs_wanted() == 2


def test_unknown_fields_are_kept_aside_and_known_ones_stay_strict():
    request = CompletionRequest(model="m", prompt="hi", frobnicate=3, logit_bias=None)
    assert request.unknown_fields == ["frobnicate"]
    assert "frobnicate" not in request.sampling_params(None).__dict__
    with pytest.raises(pydantic.ValidationError, match="max_tokens"):
        CompletionRequest(model="m", prompt="hi", max_tokens="lots")
    assert ChatCompletionRequest(model="m", messages=[], logprobs=False).unknown_fields == []


def test_unknown_fields_are_found_at_every_depth_and_logged_once(caplog):
    # what the openai library's ChatCompletionMessage.model_dump() gives, sent back as history
    reply = {
        "role": "assistant",
        "content": "w7",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "index": 0, "function": {"name": "f", "arguments": "{}", "extra": 1}}
        ],
    }
    with caplog.at_level(logging.WARNING, logger="nanovllm.entrypoints.protocol"):
        request = ChatCompletionRequest.model_validate(
            {
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}, reply],
                "stream_options": {"include_usage": True, "continuous_usage_stats": True, "frob": 1},
                "tools": [
                    {
                        "type": "function",
                        "defer_loading": False,
                        "function": {"name": "f", "parameters": {"type": "object"}, "examples": []},
                    }
                ],
                "tool_choice": {"type": "function", "function": {"name": "f", "x": 1}},
            }
        )
    unknown = [
        "stream_options.frob",
        "messages.0.content.0.cache_control",
        "messages.1.refusal",
        "messages.1.annotations",
        "messages.1.audio",
        "messages.1.function_call",
        "messages.1.tool_calls.0.index",
        "messages.1.tool_calls.0.function.extra",
        "tools.0.defer_loading",
        "tools.0.function.examples",
        "tool_choice.function.x",
    ]
    assert sorted(request.unknown_fields) == sorted(unknown)
    [record] = caplog.records
    assert all(path in record.getMessage() for path in unknown)
    # the unknown fields reach neither the template nor the tool constraint
    assert request.tool_list() == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert request.effective_tool_choice() == {"type": "function", "function": {"name": "f"}}
    assert request.conversation()[1] == {
        "role": "assistant",
        "content": "w7",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}],
    }
    assert request.continuous_usage


def test_a_lone_surrogate_in_a_stop_string_is_a_value_error():
    with pytest.raises(ValueError, match="a stop string is not valid Unicode"):
        CompletionRequest(prompt="hi", stop=["ok", "\ud800"]).sampling_params(None)
    with pytest.raises(ValueError, match="a stop string is not valid Unicode"):
        ChatCompletionRequest(messages=[], stop="x\udfff").sampling_params(None)


def test_prompt_logprobs_in_vllm_shape():
    positions = [None, {7: Logprob(-0.5, 2, " b"), 9: Logprob(-0.2, 1, " c")}]
    assert prompt_logprobs_json(positions) == [
        None,
        {
            "7": {"logprob": -0.5, "rank": 2, "decoded_token": " b"},
            "9": {"logprob": -0.2, "rank": 1, "decoded_token": " c"},
        },
    ]


@pytest.mark.parametrize(
    "prompt, expected",
    [("hi", ["hi"]), ([3, 4], [[3, 4]]), (["hi", "yo"], ["hi", "yo"]), ([[3, 4], [5]], [[3, 4], [5]])],
)
def test_prompts_are_one_or_a_batch(prompt, expected):
    assert CompletionRequest(model="m", prompt=prompt).prompts() == expected


def test_chat_max_completion_tokens_takes_precedence_and_text_parts_join():
    request = ChatCompletionRequest(
        model="m",
        max_completion_tokens=9,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}], "name": "u"}
        ],
    )
    assert request.sampling_params(None).max_tokens == 9
    # the parts go to render_chat as parts, which joins them one per line as LLM.chat does
    assert request.conversation() == [
        {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}], "name": "u"}
    ]
    assert text_messages(request.conversation())[0]["content"] == "a \nb"
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
