"""The harmony format that gpt-oss writes its replies in, read from a reply's text with its special tokens kept.

A reply is a run of messages. The chat template's generation prompt opens the
first (`<|start|>assistant`), so the reply begins with that message's header;
each later one opens with `<|start|>`. A header names the role (first word,
left out in the first message), `<|channel|>` and the channel (`analysis`:
the reasoning; `commentary`: tool calls and preambles; `final`: the answer),
and for a tool call ` to=functions.NAME` (before or after the channel) and
the arguments' type (`<|constrain|>json`, or `json` alone); `<|message|>`
ends it. The content runs to `<|end|>`, or to `<|call|>` / `<|return|>`,
which end the turn (stop tokens, which the reply's text may not hold: its end
ends the message too).

`read_messages` reads the messages of a reply so far: those whose header is
whole, the last one's content less a tail that may be the start of a tag, so
that a streamed reply's messages only grow.
"""

import re
from dataclasses import dataclass

from nanovllm.entrypoints.partial_tags import partial_tag

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
FUNCTIONS = "functions."


@dataclass
class HarmonyMessage:
    """One message of a reply: its channel and recipient (None where the header names none), its content, and
    `raw`, the message as written (header, `<|message|>`, content), for a parser that passes it on."""

    channel: str | None
    recipient: str | None
    content: str
    raw: str

    @property
    def called_function(self) -> str | None:
        """The function the message calls (its recipient `functions.NAME`), else None."""
        if self.recipient is None or not self.recipient.startswith(FUNCTIONS):
            return None
        return self.recipient.removeprefix(FUNCTIONS)


def read_messages(text: str, whole: bool = False) -> list[HarmonyMessage]:
    """The messages of `text`, a reply so far (`whole`: the whole reply), whose header is whole, in order; text
    before the first header that holds no `<|message|>` (plain text) is none."""
    messages = []
    segments = text.split(START)
    for index, segment in enumerate(segments):
        header_end = segment.find(MESSAGE)
        if header_end < 0:
            continue  # plain text, or a header still being written
        header, body = segment[:header_end], segment[header_end + len(MESSAGE) :]
        ends = [at for at in (body.find(end) for end in _ENDS) if at >= 0]
        last = index == len(segments) - 1
        if ends:
            body = body[: min(ends)]
        elif last and not whole:  # a tail that may begin <|end|>, <|call|>, <|return|> or <|start|> waits
            body = body[: len(body) - max(partial_tag(body, end) for end in (*_ENDS, START))]
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        raw = (START if index else "") + header + MESSAGE + body
        messages.append(HarmonyMessage(channel and channel.group(1), recipient and recipient.group(1), body, raw))
    return messages


def split_harmony(text: str, whole: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a reply so far (`whole`: the whole reply): the analysis messages' contents, one
    per line; and the final messages' contents, with every other message (a tool call, a preamble) passed on as
    written, for the tool parser (`openai`). A reply with no message header at all is all answer."""
    if MESSAGE not in text and whole:
        return "", text
    reasoning, answer = [], []
    for message in read_messages(text, whole):
        if message.channel == "analysis":
            reasoning.append(message.content)
        elif message.channel == "final":
            answer.append(message.content)
        else:
            answer.append(message.raw)
    return "\n".join(reasoning), "".join(answer)


class HarmonyReasoningStream:
    """One reply's `split_harmony`, fed its text in deltas of any size: each `feed` returns the (reasoning,
    answer) text it settles, `finish` what is left once the reply ends (as `reasoning.ReasoningStream`)."""

    def __init__(self):
        self._text = ""
        self._sent = ("", "")  # the reasoning and answer sent so far

    def feed(self, delta: str) -> tuple[str, str]:
        self._text += delta
        return self._settle(split_harmony(self._text))

    def finish(self) -> tuple[str, str]:
        return self._settle(split_harmony(self._text, whole=True))

    def _settle(self, parts: tuple[str, str]) -> tuple[str, str]:
        """What of `parts` extends what was sent (a part that no longer does, sends nothing more)."""
        new = tuple(part[len(sent) :] if part.startswith(sent) else "" for part, sent in zip(parts, self._sent))
        self._sent = tuple(sent + more for sent, more in zip(self._sent, new))
        return new
