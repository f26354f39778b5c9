"""Tool calls and structured outputs on the server: the constraint a tool_choice makes, calls parsed from
a reply, and, with the real `openai` client against the bundled SmolLM2 (a Hermes-style tool template),
a forced call and its result round-tripped, streamed and not, plus response_format and guided fields."""

import json
import os
import socket
import threading
import time

import httpx
import jsonschema
import openai
import pytest
import uvicorn

from nanovllm.entrypoints.api_server import ServerSettings, build_app
from nanovllm.entrypoints.tool_calls import parse_tool_calls, tool_choice_constraint
from nanovllm.frontend.online_engine import OnlineEngine

from helpers.scripted_replies import joined_tool_calls

pytest.importorskip("xgrammar")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
# Hermes style, as Qwen's templates: tools in the system turn, calls and results in tags
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions: {{ tools | tojson }}\n"
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{%- for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_named_function_constrains_the_reply_to_its_parameters():
    spec = tool_choice_constraint([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert spec.json == TIME["function"]["parameters"]
    with pytest.raises(ValueError, match="'get_date', which is not among the tools"):
        tool_choice_constraint([WEATHER], {"type": "function", "function": {"name": "get_date"}})


def test_required_constrains_the_reply_to_a_list_of_calls():
    spec = tool_choice_constraint([WEATHER, TIME], "required")
    calls = [
        {"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}},
        {"name": "get_time", "parameters": {"zone": "CET"}},
    ]
    jsonschema.validate(calls, spec.json)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_time", "parameters": {"city": "Oslo"}}], spec.json)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], spec.json)
    assert tool_choice_constraint([WEATHER], "auto") is None and tool_choice_constraint([WEATHER], "none") is None


def test_calls_are_parsed_from_each_kind_of_reply():
    named = {"type": "function", "function": {"name": "get_time"}}
    content, [call] = parse_tool_calls('{"zone": "UTC"}', named)
    assert (content, call.name, json.loads(call.arguments)) == (None, "get_time", {"zone": "UTC"})
    content, calls = parse_tool_calls(
        '[{"name": "get_time", "parameters": {"zone": "UTC"}}, '
        '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "celsius"}}]',
        "required",
    )
    assert content is None and [c.name for c in calls] == ["get_time", "get_weather"]
    content, [call] = parse_tool_calls(
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Oslo", "unit": "celsius"}}\n</tool_call>',
        "auto",
    )
    assert content == "Let me look." and json.loads(call.arguments) == {"city": "Oslo", "unit": "celsius"}
    assert parse_tool_calls("Just text.", "auto") == ("Just text.", [])
    # not cut short by max_tokens, yet not JSON (a stop string, say): no calls claimed
    assert parse_tool_calls('{"zone": "U', named) == ('{"zone": "U', [])
    # an "auto" call cut short stays text
    assert parse_tool_calls('<tool_call>{"name": "get_time", "argu', "auto", cut=True)[1] == []
    assert call.as_openai(3)["index"] == 3 and call.as_openai()["id"].startswith("call_")


def test_a_forced_call_cut_short_is_still_a_call_with_the_arguments_so_far():
    named = {"type": "function", "function": {"name": "get_time"}}
    content, [call] = parse_tool_calls('{"zone": "U', named, cut=True)
    assert (content, call.name, call.arguments) == (None, "get_time", '{"zone": "U')
    whole = '{"name": "get_time", "parameters": {"zone": "UTC"}}'
    content, calls = parse_tool_calls(
        f'[{whole}, {{"name": "get_weather", "parameters": {{"city": "Ro', "required", cut=True
    )
    assert content is None and [(c.name, c.arguments) for c in calls] == [
        ("get_time", '{"zone": "UTC"}'),
        ("get_weather", '{"city": "Ro'),
    ]
    # the call being written counts once its name is whole; before that only the whole ones do
    assert [c.arguments for c in parse_tool_calls(f'[{whole}, {{"name": "get_time"', "required", cut=True)[1]] == [
        '{"zone": "UTC"}',
        "",
    ]
    assert [c.name for c in parse_tool_calls(f'[{whole}, {{"name": "get_ti', "required", cut=True)[1]] == ["get_time"]
    assert parse_tool_calls('[{"na', "required", cut=True) == ('[{"na', [])


def test_parallel_tool_calls_false_allows_one_call():
    spec = tool_choice_constraint([WEATHER, TIME], "required", parallel=False)
    one = {"name": "get_time", "parameters": {"zone": "CET"}}
    jsonschema.validate([one], spec.json)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([one, one], spec.json)
    tagged = '<tool_call>{"name": "get_time", "arguments": {"zone": "A"}}</tool_call>'
    content, calls = parse_tool_calls(f"Two.{tagged}{tagged.replace('A', 'B')}", "auto", parallel=False)
    assert content == "Two." and [json.loads(c.arguments) for c in calls] == [{"zone": "A"}]
    assert len(parse_tool_calls(f"[{json.dumps(one)}, {json.dumps(one)}]", "required", parallel=False)[1]) == 1


@pytest.fixture(scope="module")
def tools_model_dir(smollm_dir, tmp_path_factory):
    """The bundled SmolLM2 (weights linked, not copied) with a tool-calling chat template."""
    path = tmp_path_factory.mktemp("smollm-tools")
    for name in os.listdir(smollm_dir):
        if name != "chat_template.jinja":
            os.symlink(os.path.join(smollm_dir, name), path / name)
    (path / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def server(tools_model_dir):
    online = OnlineEngine(tools_model_dir, max_model_len=1024)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(build_app(online, ServerSettings("smol")), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    online.shutdown()


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.slow
def test_a_forced_call_and_its_result_round_trip(server):
    client = client_of(server)
    response = client.chat.completions.create(
        model="smol",
        messages=QUESTION,
        tools=[WEATHER, TIME],
        temperature=0.7,
        seed=1,
        max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = response.choices[0]
    [call] = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    conversation = QUESTION + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"},
    ]
    answer = client.chat.completions.create(
        model="smol", messages=conversation, tools=[WEATHER, TIME], max_tokens=30, temperature=0
    )
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None


@pytest.mark.slow
def test_a_required_call_streams_as_tool_call_deltas(server):
    client = client_of(server)
    chunks = list(
        client.chat.completions.create(
            model="smol",
            messages=QUESTION,
            tools=[WEATHER, TIME],
            tool_choice="required",
            temperature=0.7,
            seed=2,
            max_tokens=120,
            stream=True,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = joined_tool_calls(streamed_tool_call_entries(chunks))
    assert calls and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    for call in calls:
        tool = WEATHER if call["name"] == "get_weather" else TIME
        jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])


@pytest.mark.slow
def test_response_format_json_schema_and_guided_fields(server):
    client = client_of(server)
    schema = WEATHER["function"]["parameters"]
    response = client.chat.completions.create(
        model="smol",
        messages=QUESTION,
        temperature=0.9,
        seed=3,
        max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(response.choices[0].message.content), schema)
    completion = client.completions.create(
        model="smol",
        prompt="My phone number:",
        max_tokens=12,
        temperature=1.0,
        extra_body={"guided_regex": r"\d{3}-\d{4}"},
    )
    assert completion.choices[0].text.count("-") == 1 and len(completion.choices[0].text) == 8
    picked = client.completions.create(
        model="smol",
        prompt="Yes or no?",
        max_tokens=5,
        temperature=1.0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert picked.choices[0].text in ("yes", "no")


@pytest.mark.parametrize(
    "body, message",
    [
        ({"guided_json": {"type": "objekt"}}, "json is invalid"),
        ({"guided_regex": "a(b"}, "regex is invalid"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "send one constraint"),
        ({"structured_outputs": {"jsonn": {}}}, "unknown: jsonn"),
        ({"response_format": {"type": "json_schema"}}, "needs a json_schema"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not among the tools",
        ),
        ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "already constrains"),
    ],
)
@pytest.mark.slow
def test_bad_constraints_are_400s_that_say_what_is_wrong(server, body, message):
    response = httpx.post(
        f"{server}/v1/chat/completions", json={"model": "smol", "messages": QUESTION, "max_tokens": 4, **body}
    )
    assert response.status_code == 400 and message in response.json()["error"]["message"]


@pytest.mark.slow
def test_a_tool_message_needs_its_call_id(server):
    messages = QUESTION + [{"role": "tool", "content": "18 degrees"}]
    response = httpx.post(f"{server}/v1/chat/completions", json={"model": "smol", "messages": messages})
    assert response.status_code == 400 and "tool_call_id" in response.json()["error"]["message"]


@pytest.mark.slow
def test_a_streamed_call_goes_back_with_its_result(server):
    client = client_of(server)
    chunks = list(
        client.chat.completions.create(
            model="smol",
            messages=QUESTION,
            tools=[WEATHER],
            temperature=0.7,
            seed=4,
            max_tokens=80,
            stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    )
    [joined] = joined_tool_calls(streamed_tool_call_entries(chunks))
    call = {
        "id": joined["id"],
        "type": "function",
        "function": {"name": joined["name"], "arguments": joined["arguments"]},
    }
    conversation = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": joined["id"], "content": "18 degrees, sunny"},
    ]
    answer = client.chat.completions.create(
        model="smol", messages=conversation, tools=[WEATHER], max_tokens=20, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in answer)


@pytest.mark.slow
def test_tool_choice_none_leaves_the_tools_out_and_auto_may_answer_in_text(server):
    client = client_of(server)
    plain = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=1)
    none = client.chat.completions.create(
        model="smol", messages=QUESTION, tools=[WEATHER], tool_choice="none", max_tokens=1
    )
    auto = client.chat.completions.create(
        model="smol", messages=QUESTION, tools=[WEATHER], max_tokens=16, temperature=0
    )
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens
    message = auto.choices[0].message
    assert (message.tool_calls is None) == (auto.choices[0].finish_reason != "tool_calls")
    assert message.tool_calls or message.content


@pytest.mark.slow
def test_a_forced_call_cut_short_comes_back_as_a_call_streamed_or_not(server):
    client = client_of(server)
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(
        model="smol", messages=QUESTION, tools=[WEATHER], tool_choice=named, max_tokens=5, temperature=0
    )
    choice = whole.choices[0]
    [call] = choice.message.tool_calls
    assert (choice.finish_reason, choice.message.content, call.function.name) == ("length", None, "get_weather")
    assert call.function.arguments.startswith("{") and whole.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            model="smol",
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice=named,
            max_tokens=5,
            temperature=0,
            stream=True,
        )
    )
    [joined] = joined_tool_calls(streamed_tool_call_entries(chunks))
    assert joined["arguments"] == call.function.arguments and chunks[-1].choices[0].finish_reason == "length"
    required = client.chat.completions.create(
        model="smol", messages=QUESTION, tools=[WEATHER, TIME], tool_choice="required", max_tokens=16, temperature=0
    )
    assert required.choices[0].finish_reason == "length"
    assert [c.function.name in ("get_weather", "get_time") for c in required.choices[0].message.tool_calls] == [True]


@pytest.mark.slow
def test_parallel_tool_calls_false_gives_one_call(server):
    response = client_of(server).chat.completions.create(
        model="smol",
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=0.7,
        seed=2,
        max_tokens=120,
        parallel_tool_calls=False,
    )
    assert len(response.choices[0].message.tool_calls) == 1


def streamed_tool_call_entries(chunks) -> list[dict]:
    """The `tool_calls` delta entries of a stream of the openai client's chunks, as dicts."""
    return [d.model_dump(exclude_none=True) for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
