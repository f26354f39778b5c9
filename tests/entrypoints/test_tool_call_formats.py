"""The tool-call formats on replies written as each format's published form: calls and content of a whole
reply, arguments typed by the tool's schema (qwen3_coder), malformed calls left as content, and, for every
prefix of a reply, streamed content that stops short of the calls; and on the chat endpoint, with the tiny
model's text replaced by scripted replies."""

import json

import pytest

from nanovllm.entrypoints.api_server import ServerSettings
from nanovllm.entrypoints.tool_call_formats import FORMATS, PartialCall
from nanovllm.entrypoints.tool_call_stream import ToolCallStream

from helpers.api_servers import MODEL, RunningServer
from helpers.scripted_replies import chat, deltas, joined_tool_calls, scripted_replies

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array"},
                "offset": {"type": "number"},
            },
        },
    },
}
TOOLS = [WEATHER]

QWEN3_CODER = (
    "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, CA\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[9, 12]\n"
    "</parameter>\n<parameter=offset>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=get_time>\n<parameter=zone>\n42\n</parameter>\n</function>\n</tool_call>"
)
HERMES = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
LLAMA3 = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'
)
MISTRAL_ARRAY = 'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'
MISTRAL_NAMED = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'
# gpt-oss: reasoning, a preamble, then two calls (the recipient after the channel, then in the role part)
HARMONY = (
    "<|channel|>analysis<|message|>Two calls needed.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris"}<|call|>'
    "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"
)
REPLIES = {
    "qwen3_coder": QWEN3_CODER,
    "hermes": HERMES,
    "llama3_json": LLAMA3,
    "mistral": MISTRAL_NAMED,
    "openai": HARMONY,
}


def calls_of(name: str, text: str) -> tuple[str | None, list[tuple[str, dict]]]:
    content, calls = FORMATS[name].parse(text, TOOLS)
    return content, [(call.name, json.loads(call.arguments)) for call in calls]


def test_qwen3_coder_reads_each_value_as_its_parameters_type_and_untyped_ones_as_json():
    content, calls = calls_of("qwen3_coder", QWEN3_CODER)
    assert content == "Let me check."
    assert calls == [
        ("get_weather", {"city": "San Francisco, CA", "days": 3, "metric": True, "hours": [9, 12], "offset": 2}),
        ("get_time", {"zone": 42}),  # a tool not among the tools: its values as the JSON they spell
    ]


def test_qwen3_coder_keeps_a_value_that_is_not_of_its_type_as_text():
    reply = "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>"
    assert calls_of("qwen3_coder", reply) == (None, [("get_weather", {"days": "three"})])


def test_hermes_llama3_and_mistral_calls_and_content():
    assert calls_of("hermes", HERMES) == ("Sure.", [("get_weather", {"city": "Paris"})])
    assert calls_of("llama3_json", LLAMA3) == (None, [("get_weather", {"city": "Paris"}), ("get_time", {})])
    assert calls_of("mistral", MISTRAL_ARRAY) == ("Checking.", [("get_weather", {"city": "Paris"})])
    assert calls_of("mistral", MISTRAL_NAMED) == (None, [("get_weather", {"city": "Paris"}), ("get_time", {})])


def test_harmony_calls_are_the_messages_to_functions_and_the_content_is_the_final_channels():
    assert calls_of("openai", HARMONY) == (None, [("get_weather", {"city": "Paris"}), ("get_time", {})])
    answered = "<|channel|>final<|message|>Sunny.<|return|>"
    assert calls_of("openai", answered) == (answered, [])  # no call: the text is left as it is
    with_answer = HARMONY.replace(
        "<|call|><|start|>assistant to",
        "<|end|><|start|>assistant<|channel|>final<|message|>Let me check.<|end|><|start|>assistant to",
    )
    assert calls_of("openai", with_answer)[0] == "Let me check."
    # reasoning that mentions a call is no call
    thought = "<|channel|>analysis<|message|>I could use to=functions.get_weather here.<|end|>"
    assert calls_of("openai", thought) == (thought, [])


def test_mistral_call_ids_are_nine_letters_and_digits():
    _, calls = FORMATS["mistral"].parse(MISTRAL_NAMED, TOOLS)
    assert all(len(call.id) == 9 and call.id.isalnum() for call in calls)


@pytest.mark.parametrize(
    "name, reply",
    [
        ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"),  # cut short
        ("qwen3_coder", "a <tool_call> b </tool_call>"),
        ("hermes", "<tool_call>{not json}</tool_call>"),
        ("llama3_json", '{"name": "get_weather"}'),  # no parameters
        ("llama3_json", '{"name": "get_weather", "parameters": {}} and then text'),
        ("llama3_json", "The weather is fine."),
        ("mistral", "[TOOL_CALLS] [{oops"),
        ("mistral", "[TOOL_CALLS]get_weather{}"),
        ("mistral", "No calls here."),
    ],
)
def test_a_reply_whose_calls_do_not_parse_is_content_with_no_calls(name, reply):
    assert FORMATS[name].parse(reply, TOOLS) == (reply, [])


@pytest.mark.parametrize("name", REPLIES)
def test_streamed_content_of_every_prefix_stops_short_of_the_calls(name):
    reply = REPLIES[name]
    content, _ = FORMATS[name].parse(reply, TOOLS)
    fmt, shown = FORMATS[name], 0
    for end in range(len(reply) + 1):
        shown = max(shown, fmt.content_end(reply[:end]))
    # what went out as content is the reply's content, up to the whitespace before the calls
    assert reply[:shown].strip() == (content or "")


@pytest.mark.parametrize("name, reply", [*REPLIES.items(), ("mistral", MISTRAL_ARRAY)])
def test_calls_streamed_token_by_token_join_into_the_whole_replys_calls(name, reply):
    fmt = FORMATS[name]
    _, whole = fmt.parse(reply, TOOLS)
    stream, entries, first_entry_at = ToolCallStream(fmt.new_call_id), [], None
    for end in range(len(reply) + 1):
        new = stream.deltas(fmt.partial_calls(reply[:end], TOOLS))
        if new and first_entry_at is None:
            first_entry_at = end
        entries += new
    entries += stream.deltas([PartialCall(call.name, call.arguments) for call in whole])
    joined = joined_tool_calls(entries)
    assert [(c["name"], c["arguments"]) for c in joined] == [(c.name, c.arguments) for c in whole]
    # each call's arguments came in pieces, the first call's name before the reply was whole
    assert len(entries) > len(whole) and first_entry_at < len(reply)
    if name == "mistral":
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in joined)


def test_a_call_that_stops_parsing_sends_nothing_more():
    stream = ToolCallStream(FORMATS["hermes"].new_call_id)
    [entry] = stream.deltas(FORMATS["hermes"].partial_calls('<tool_call>{"name": "f", "arguments": {"a"', TOOLS))
    assert entry["function"] == {"name": "f", "arguments": '{"a"'}
    assert stream.deltas([PartialCall("f", '{"b": 1}')]) == []


def test_llama3_content_streams_where_the_reply_begins_with_text():
    assert FORMATS["llama3_json"].content_end("The weather") == len("The weather")
    assert FORMATS["llama3_json"].content_end(" <|python") == 0


@pytest.fixture(scope="module", params=["qwen3_coder", "mistral"])
def server(request, chat_model_dir):
    running = RunningServer(chat_model_dir, ServerSettings(MODEL, tool_call_parser=request.param), step_seconds=0.002)
    running.parser = request.param
    yield running
    running.close()


def test_the_chat_endpoint_reads_auto_calls_in_the_servers_format(server, monkeypatch):
    script = scripted_replies(monkeypatch)
    reply = QWEN3_CODER if server.parser == "qwen3_coder" else MISTRAL_ARRAY
    max_tokens = script([reply[i : i + 7] for i in range(0, len(reply), 7)])
    want_content, want_calls = calls_of(server.parser, reply)
    choice = chat(server, max_tokens, tools=TOOLS).json()["choices"][0]
    assert choice["message"]["content"] == want_content  # finish_reason "length": the script ends at max_tokens
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert calls == want_calls
    chunks = deltas(chat(server, max_tokens, stream=True, tools=TOOLS))
    assert "".join(c["delta"].get("content") or "" for c in chunks).strip() == want_content
    joined = joined_tool_calls([entry for c in chunks for entry in c["delta"].get("tool_calls", [])])
    assert [(c["name"], json.loads(c["arguments"])) for c in joined] == want_calls
    # the calls came as they were written: the first one's name before the reply's last chunk
    assert "tool_calls" in next(c["delta"] for c in chunks if "tool_calls" in c["delta"]) and len(chunks) > 2
