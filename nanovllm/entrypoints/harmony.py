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

Where the vocabulary holds the tags as special tokens (gpt-oss's does), a
reply is read by its token ids (`HarmonyReasoningStream` with a tokenizer):
only those ids are tags, and a tag's text that the model spells out in plain
tokens stays content.
"""

import re
from dataclasses import dataclass

from tokenizers.decoders import DecodeStream

from nanovllm.entrypoints.partial_tags import partial_tag

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
TAGS = (START, CHANNEL, MESSAGE, "<|constrain|>", *_ENDS)
# "<|" of a reply's plain text, read by token ids: no tag begins so; restored in what the split returns
_PLAIN_OPENING = "<\ue000|"
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
        return "", text.replace(_PLAIN_OPENING, "<|")
    reasoning, answer = [], []
    for message in read_messages(text, whole):
        if message.channel == "analysis":
            reasoning.append(message.content)
        elif message.channel == "final":
            answer.append(message.content)
        else:
            answer.append(message.raw)
    return "\n".join(reasoning).replace(_PLAIN_OPENING, "<|"), "".join(answer).replace(_PLAIN_OPENING, "<|")


def harmony_tag_ids(tokenizer) -> set[int] | None:
    """The ids of harmony's tags where the vocabulary of `tokenizer` (a transformers tokenizer) holds each as
    one special token, else None: the reply is then read from its text."""
    added = {token.content: token_id for token_id, token in tokenizer.added_tokens_decoder.items() if token.special}
    if not all(tag in added for tag in TAGS):
        return None
    return {added[tag] for tag in TAGS}


class HarmonyReasoningStream:
    """One reply's `split_harmony`, fed in deltas of any size: each `feed` returns the (reasoning, answer) text
    it settles, `finish` what is left once the reply ends (as `reasoning.ReasoningStream`). With a `tokenizer`
    whose vocabulary holds the tags (`harmony_tag_ids`), the reply is read from its token ids, decoded here;
    else from its text."""

    def __init__(self, tokenizer=None):
        self._text = ""
        self._sent = ("", "")  # the reasoning and answer sent so far
        self._tag_ids = None if tokenizer is None else harmony_tag_ids(tokenizer)
        if self._tag_ids is not None:
            self._backend = tokenizer.backend_tokenizer
            self._decoder = DecodeStream(skip_special_tokens=False)

    def feed(self, delta: str, token_ids: list[int] = ()) -> tuple[str, str]:
        """The (reasoning, answer) text that the reply's next piece settles: its text `delta`, or where the
        reply is read by ids, its `token_ids`."""
        self._text += delta if self._tag_ids is None else self._decoded(token_ids)
        return self._settle(split_harmony(self._text))

    def _decoded(self, token_ids: list[int]) -> str:
        """The text of `token_ids`, the plain tokens' "<|" changed so that only the tag ids read as tags."""
        pieces, last = [], self._text[-1:]
        for token_id in token_ids:
            piece = self._decoder.step(self._backend, token_id) or ""
            if token_id not in self._tag_ids:
                if piece.startswith("|") and last == "<":  # a "<|" split between two plain tokens
                    piece = _PLAIN_OPENING[1:] + piece[1:]
                piece = piece.replace("<|", _PLAIN_OPENING)
            pieces.append(piece)
            last = piece[-1:] or last
        return "".join(pieces)

    def finish(self) -> tuple[str, str]:
        return self._settle(split_harmony(self._text, whole=True))

    def _settle(self, parts: tuple[str, str]) -> tuple[str, str]:
        """What of `parts` extends what was sent (a part that no longer does, sends nothing more)."""
        new = tuple(part[len(sent) :] if part.startswith(sent) else "" for part, sent in zip(parts, self._sent))
        self._sent = tuple(sent + more for sent, more in zip(self._sent, new))
        return new
