"""Reasoning parsers: replies split into reasoning and answer, whole and streamed in pieces of every size, and
on the chat endpoint (`reasoning_content` beside `content`, tool calls read from the answer only), with
the tiny model's text replaced by scripted replies."""

import itertools
import json

import pytest

from nanovllm.cli import build_parser
from nanovllm.entrypoints.api_server import ServerSettings
from nanovllm.entrypoints.reasoning import (
    READS_SPECIAL_TOKENS,
    REASONING_PARSERS,
    ReasoningStream,
    reasoning_stream,
    split_reasoning,
)

from helpers.api_servers import MODEL, RunningServer
from helpers.scripted_replies import chat, deltas, joined_tool_calls, scripted_replies

# the parsers that split at </think>; openai_gptoss reads harmony messages instead
THINK_PARSERS = [p for p in REASONING_PARSERS if p not in READS_SPECIAL_TOKENS]
QWEN3 = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"
QWEN3_TEMPLATE_THINKS = "The <think> was in the prompt.\n</think>\n\nAnswer."
DEEPSEEK_R1 = "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4."
DEEPSEEK_R1_0528 = "<think>\nOkay.\n</think>\n\n**4**\n\nDone."
# gpt-oss's harmony replies, as its generation prompt (<|start|>assistant) leaves them to be written
HARMONY = (
    "<|channel|>analysis<|message|>The user greets me.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
)
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need the weather: call get_weather.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    "<|call|>"
)
# a reply cut by max_tokens inside its second analysis message
HARMONY_CUT = (
    "<|channel|>analysis<|message|>First thought.<|end|><|start|>assistant<|channel|>analysis<|message|>Second"
)


def streamed(text: str, parser: str, cuts: list[int]) -> tuple[str | None, str | None]:
    """(reasoning, answer) of `text` fed to a stream in pieces ending at `cuts`, joined (each None when empty)."""
    stream = reasoning_stream(parser)
    bounds = [0, *cuts, len(text)]
    parts = [stream.feed(text[a:b]) for a, b in itertools.pairwise(bounds)] + [stream.finish()]
    return "".join(r for r, _ in parts) or None, "".join(a for _, a in parts) or None


def assert_streams_split_as_whole(text: str, parser: str) -> None:
    """A stream fed one character at a time, or the text in two pieces cut anywhere, splits as the whole does."""
    whole = split_reasoning(text, parser)
    assert streamed(text, parser, list(range(1, len(text)))) == whole
    for cut in range(len(text) + 1):
        assert streamed(text, parser, [cut]) == whole, cut


@pytest.mark.parametrize(
    "parser, text, want",
    [
        ("qwen3", QWEN3, ("\nThe user greets me.\n", "Hello! How can I help?")),
        ("qwen3", QWEN3_TEMPLATE_THINKS, ("The <think> was in the prompt.\n", "Answer.")),
        ("qwen3", "Hello, no thinking here.", (None, "Hello, no thinking here.")),
        ("qwen3", "<think></think>\n\nJust the answer.", (None, "Just the answer.")),
        ("deepseek_r1", DEEPSEEK_R1, ("Okay, 2 + 2 is 4.\n", "The answer is 4.")),
        ("deepseek_r1", DEEPSEEK_R1_0528, ("\nOkay.\n", "**4**\n\nDone.")),
        (
            "deepseek_r1",
            " \n<think>Opened after a blank.</think>Then the answer.",
            ("Opened after a blank.", "Then the answer."),
        ),
        ("openai_gptoss", HARMONY, ("The user greets me.", "Hello! How can I help?")),
        # the call passes on to the answer as written, for the openai tool-call parser
        (
            "openai_gptoss",
            HARMONY_CALL,
            ("Need the weather: call get_weather.", HARMONY_CALL[HARMONY_CALL.index("<|start|>") : -len("<|call|>")]),
        ),
        ("openai_gptoss", HARMONY_CUT, ("First thought.\nSecond", None)),
        # text with no harmony message (malformed) is all answer, never an error
        ("openai_gptoss", "No channels at all.", (None, "No channels at all.")),
    ],
)
def test_each_format_splits_whole_and_streamed_in_any_pieces(parser, text, want):
    assert split_reasoning(text, parser) == want
    assert_streams_split_as_whole(text, parser)


def test_a_reply_cut_before_its_end_tag():
    """Cut by max_tokens inside the reasoning: deepseek_r1 has it all as reasoning; qwen3, as vLLM, has a
    reply without </think> as all answer, verbatim."""
    cut = "<think>\nLet me count: 1, 2, 3, </th"
    assert split_reasoning(cut, "deepseek_r1") == ("\nLet me count: 1, 2, 3, </th", None)
    assert split_reasoning(cut, "qwen3") == (None, cut)
    assert split_reasoning("<think>", "deepseek_r1") == (None, None)
    assert split_reasoning("<thi", "deepseek_r1") == ("<thi", None)
    assert split_reasoning("<think>", "qwen3") == (None, "<think>")
    for parser in THINK_PARSERS:
        assert split_reasoning("", parser) == (None, None)
        assert split_reasoning("Reasoning.</think>\n\n", parser) == ("Reasoning.", None)
        assert_streams_split_as_whole(cut, parser)


@pytest.mark.parametrize("parser", THINK_PARSERS)
@pytest.mark.parametrize(
    "text, want",
    [
        ("</think>", (None, None)),
        ("</think></think>", (None, "</think>")),
        ("<think>a<think>b</think>c</think>d", ("a<think>b", "c</think>d")),
        ("<think>a</think>b<think>c</think>d", ("a", "b<think>c</think>d")),
        ("Before <think>inside</think>after", ("Before <think>inside", "after")),
        ("<think>x</think>\r\n\n \nspaces stay", ("x", " \nspaces stay")),
        ("<<think>></think><</think", ("<<think>>", "<</think")),
    ],
)
def test_malformed_replies_split_by_the_first_end_tag_and_never_fail(parser, text, want):
    assert split_reasoning(text, parser) == want
    assert_streams_split_as_whole(text, parser)


def test_streamed_deltas_come_as_the_text_does_but_a_possible_tag():
    stream = ReasoningStream("deepseek_r1")
    assert stream.feed("<thi") == ("", "")  # may be the opening tag
    assert stream.feed("nk>Step one.</th") == ("Step one.", "")  # '</th' is held back
    assert stream.feed("is is no tag") == ("</this is no tag", "")
    assert stream.feed("</think>\n") == ("", "")  # the newlines after the tag are dropped
    assert stream.feed("\nAnswer") == ("", "Answer")
    assert stream.finish() == ("", "")
    qwen3 = ReasoningStream("qwen3")
    assert qwen3.feed("<think>Step one.") == ("", "")  # all answer, unless a </think> comes
    assert qwen3.feed("</think>Answer") == ("Step one.", "Answer")
    assert qwen3.feed(" goes on.") == ("", " goes on.")
    undecided = ReasoningStream("qwen3")
    assert undecided.feed("No tags at all.") == ("", "")
    assert undecided.finish() == ("", "No tags at all.")


def test_an_unknown_parser_is_refused_with_the_names():
    with pytest.raises(ValueError, match="deepseek_r1, openai_gptoss, qwen3"):
        ReasoningStream("granite")
    with pytest.raises(ValueError, match="deepseek_r1, openai_gptoss, qwen3"):
        ServerSettings(MODEL, reasoning_parser="granite")


def test_serve_takes_reasoning_parser_and_refuses_an_unknown_one(capsys):
    assert build_parser().parse_args(["serve", "/m"]).reasoning_parser is None
    assert build_parser().parse_args(["serve", "/m", "--reasoning-parser", "qwen3"]).reasoning_parser == "qwen3"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--reasoning-parser", "granite"])
    assert "choose from 'deepseek_r1', 'openai_gptoss', 'qwen3'" in capsys.readouterr().err


@pytest.fixture(scope="module", params=[None, *THINK_PARSERS])
def server(request, chat_model_dir):
    running = RunningServer(chat_model_dir, ServerSettings(MODEL, reasoning_parser=request.param), step_seconds=0.002)
    running.parser = request.param
    yield running
    running.close()


@pytest.fixture
def script(monkeypatch):
    return scripted_replies(monkeypatch)


@pytest.mark.parametrize(
    "pieces",
    [
        ["<th", "ink>", "\nTwo and", " two.\n</", "think", ">\n", "\nFour", "."],
        ["Two and two.", "</think>\n\n", "Four."],
        ["Four, without ", "thinking."],
    ],
)
def test_chat_replies_carry_reasoning_content_beside_content(server, script, pieces):
    max_tokens = script(pieces)
    text = "".join(pieces)
    message = chat(server, max_tokens).json()["choices"][0]["message"]
    chunks = deltas(chat(server, max_tokens, stream=True))
    streamed_content = "".join(c["delta"].get("content") or "" for c in chunks)
    if server.parser is None:
        assert message == {"role": "assistant", "content": text}
        assert streamed_content == text and not any("reasoning_content" in c["delta"] for c in chunks)
        return
    reasoning, answer = split_reasoning(text, server.parser)
    assert message == {"role": "assistant", "reasoning_content": reasoning, "content": answer}
    assert (streamed_content or None) == answer
    assert ("".join(c["delta"].get("reasoning_content", "") for c in chunks) or None) == reasoning
    assert not any("think>" in (c["delta"].get("content") or "") for c in chunks if reasoning is not None)
    if "</think>" in text:
        assert (reasoning, answer) == ("\nTwo and two.\n" if pieces[0] == "<th" else "Two and two.", "Four.")


def test_the_openai_client_reads_reasoning_content_beside_content(server, script):
    """As clients read it: the openai package's message keeps the field it does not declare, and its streamed
    deltas carry it."""
    if server.parser is None:
        pytest.skip("no reasoning without a parser")
    max_tokens = script(["<think>", "Two and two.", "</think>", "\n\nFour."])
    request = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "w5 w6"}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    message = server.client().chat.completions.create(**request).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == ("Two and two.", "Four.")
    chunks = list(server.client().chat.completions.create(**request, stream=True))
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert reasoning == "Two and two."
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Four."


def test_a_reply_cut_by_max_tokens_in_its_reasoning(server, script):
    if server.parser is None:
        pytest.skip("no reasoning without a parser")
    max_tokens = script(["<think>", "Counting: ", "one, ", "two, "])
    message = chat(server, max_tokens).json()["choices"][0]["message"]
    want = ("Counting: one, two, ", None) if server.parser == "deepseek_r1" else (None, "<think>Counting: one, two, ")
    assert (message["reasoning_content"], message["content"]) == want


def test_tool_calls_are_read_from_the_answer_only(server, script):
    if server.parser is None:
        pytest.skip("no reasoning without a parser")
    call = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    max_tokens = script(["<think>Maybe ", call, "? No:", " ask.</think>\n\n", "Which zone?"])
    choice = chat(server, max_tokens, tools=tools).json()["choices"][0]
    assert choice["message"]["reasoning_content"] == f"Maybe {call}? No: ask."
    assert choice["message"]["content"] == "Which zone?" and "tool_calls" not in choice["message"]
    max_tokens = script(["<think>Need the time.</think>\n\n", call])
    message = chat(server, max_tokens, tools=tools).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Need the time.", None)
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [{"zone": "UTC"}]
    chunks = deltas(chat(server, max_tokens, stream=True, tools=tools))
    assert "".join(c["delta"].get("reasoning_content", "") for c in chunks) == "Need the time."
    assert [c["function"]["name"] for c in chunks[-1]["delta"]["tool_calls"]] == ["get_time"]


def test_a_reply_under_a_grammar_is_all_content(server, script):
    """The grammar holds from the reply's first token, so the reply has no reasoning to split off."""
    pytest.importorskip("xgrammar")
    if server.parser is None:
        pytest.skip("no reasoning without a parser")
    max_tokens = script(["Reasoning?", "</think>", "Answer."])
    constrained = chat(server, max_tokens, structured_outputs={"choice": ["w5 w6 w7"]}).json()["choices"][0]
    assert "reasoning_content" not in constrained["message"] and "</think>" in constrained["message"]["content"]


@pytest.fixture(scope="module")
def gpt_oss_server(chat_model_dir):
    settings = ServerSettings(MODEL, reasoning_parser="openai_gptoss", tool_call_parser="openai")
    running = RunningServer(chat_model_dir, settings, step_seconds=0.002)
    yield running
    running.close()


def test_harmony_replies_carry_reasoning_content_content_and_tool_calls(gpt_oss_server, script):
    max_tokens = script([HARMONY[i : i + 9] for i in range(0, len(HARMONY), 9)])
    message = chat(gpt_oss_server, max_tokens).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("The user greets me.", "Hello! How can I help?")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    max_tokens = script([HARMONY_CALL[i : i + 9] for i in range(0, len(HARMONY_CALL), 9)])
    choice = chat(gpt_oss_server, max_tokens, tools=tools).json()["choices"][0]
    assert choice["message"]["reasoning_content"] == "Need the weather: call get_weather."
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    chunks = deltas(chat(gpt_oss_server, max_tokens, stream=True, tools=tools))
    assert "".join(c["delta"].get("reasoning_content", "") for c in chunks) == "Need the weather: call get_weather."
    assert not "".join(c["delta"].get("content") or "" for c in chunks)
    [joined] = joined_tool_calls([entry for c in chunks for entry in c["delta"].get("tool_calls", [])])
    assert (joined["name"], joined["arguments"]) == ("get_weather", '{"city": "Paris"}')
