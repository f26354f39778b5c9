"""Reasoning parsers (vLLM's `--reasoning-parser`): a chat reply's text split into its reasoning and its answer.

Both formats write the reasoning first, up to a `</think>` tag, then the answer:

- `deepseek_r1`: the chat template puts `<think>` in the prompt, so the reply
  starts inside the reasoning. Everything before the first `</think>` is
  reasoning; a reply cut before it (by max_tokens, say) is all reasoning.
- `qwen3`: the model writes `<think>` itself, or the template put it in the
  prompt (the Qwen3 thinking-2507 models). As vLLM's parser does, a reply
  without `</think>` is all answer, verbatim (Qwen3 with enable_thinking
  off writes no think block); with one, everything before the first
  `</think>` is reasoning.

For both, a `<think>` that opens the reply (after any whitespace) is dropped
with that whitespace; the reasoning is kept verbatim, and the answer is what
follows the first `</think>`, less the newlines right after the tag (models
write `</think>\\n\\n` before the answer; vLLM leaves them in `content`). The split
never fails: a `<think>` elsewhere (nested, or a second block) is plain text
of the part it falls in, and a second `</think>` is part of the answer.

Streamed, the parts come out as the text arrives, less what may still be the
start of a tag; a qwen3 reply shows nothing before its `</think>` arrives
(until then it may yet be all answer), and at the end all of it as answer
when none came. The deltas of a stream join into exactly the whole split.

- `openai_gptoss`: gpt-oss's harmony messages (`harmony.py`), read from the
  reply's special tokens (by their ids where the vocabulary holds them, else
  from the text): the analysis channel is the reasoning, the final channel the
  answer, and any other message (a tool call) passes on to the answer as
  written, for the `openai` tool-call parser.
"""

from nanovllm.entrypoints.harmony import HarmonyReasoningStream
from nanovllm.entrypoints.partial_tags import partial_tag

THINK_START = "<think>"
THINK_END = "</think>"
REASONING_PARSERS = ("deepseek_r1", "openai_gptoss", "qwen3")
# the parsers that read the reply's special tokens, which detokenizing must then keep
READS_SPECIAL_TOKENS = ("openai_gptoss",)


def reasoning_stream(parser: str, tokenizer=None) -> "ReasoningStream | HarmonyReasoningStream":
    """The split of one reply under `parser`, fed as it streams; harmony's is read by token ids where
    `tokenizer`'s vocabulary holds its tags."""
    return HarmonyReasoningStream(tokenizer) if parser == "openai_gptoss" else ReasoningStream(parser)


def split_reasoning(text: str, parser: str, token_ids: list[int] = (), tokenizer=None) -> tuple[str | None, str | None]:
    """(reasoning, answer) of a whole reply under `parser`, each None when empty (read by its `token_ids`
    where `reasoning_stream` says)."""
    stream = reasoning_stream(parser, tokenizer)
    reasoning, answer = stream.feed(text, token_ids)
    rest_reasoning, rest_answer = stream.finish()
    return (reasoning + rest_reasoning) or None, (answer + rest_answer) or None


class ReasoningStream:
    """One reply's split at `</think>`, fed its text in deltas of any size: each `feed` returns the
    (reasoning, answer) text it settles, `finish` what is left once the reply ends."""

    def __init__(self, parser: str):
        if parser not in REASONING_PARSERS or parser in READS_SPECIAL_TOKENS:
            raise ValueError(f"unknown reasoning parser {parser!r}; the parsers are {', '.join(REASONING_PARSERS)}")
        self._holds_reasoning = parser == "qwen3"  # qwen3 shows no reasoning before its </think> arrives
        self._text = ""  # the reply so far
        self._start: int | None = None  # where the reasoning starts (past an opening <think>), once known
        self._end: int | None = None  # where the answer starts (past </think> and its newlines), once known
        self._sent = 0  # how far into the text the parts sent so far go

    def feed(self, delta: str, token_ids: list[int] = ()) -> tuple[str, str]:
        """The reasoning and answer text that `delta` settles (either may be ""); </think> is read from the
        text, so `token_ids` are not needed."""
        # a </think> that `delta` completes begins at most a tag's length before it
        scan = max(len(self._text) - len(THINK_END) + 1, 0)
        self._text += delta
        text = self._text
        if self._start is None:
            opening = text.lstrip()
            if len(opening) < len(THINK_START) and THINK_START.startswith(opening):
                return "", ""  # only whitespace, or what may become an opening <think>
            self._start = len(text) - len(opening) + len(THINK_START) if opening.startswith(THINK_START) else 0
            self._sent = self._start
        if self._end is None:
            return self._reasoning_delta(text, max(scan, self._start))
        return "", self._answer_delta(text)

    def finish(self) -> tuple[str, str]:
        """What the reply's end settles: text held back in case it began a tag, or a qwen3 reply that
        closed no think block (all answer)."""
        if self._end is not None:
            return "", ""  # feed settled all answer text but newlines after </think>
        if self._holds_reasoning:
            return "", self._text
        return self._text[self._sent if self._start is not None else 0 :], ""

    def _reasoning_delta(self, text: str, scan: int) -> tuple[str, str]:
        """Text up to a </think> (the reasoning), and past it whatever answer came with it; `scan` is
        where a </think> not looked for yet may begin."""
        end = text.find(THINK_END, scan)
        if end < 0:
            if self._holds_reasoning:
                return "", ""
            settled = len(text) - partial_tag(text, THINK_END)
            reasoning, self._sent = text[self._sent : settled], max(self._sent, settled)
            return reasoning, ""
        # the held text of qwen3 starts at _start: nothing of it was sent yet
        reasoning = text[self._sent : end]
        self._sent = self._end = end + len(THINK_END)
        return reasoning, self._answer_delta(text)

    def _answer_delta(self, text: str) -> str:
        """Answer text past what was sent; the newlines after </think> are dropped (while only newlines
        have come, nothing is settled)."""
        if self._sent == self._end:
            stripped = text[self._end :].lstrip("\r\n")
            if not stripped:
                return ""
            self._end = self._sent = len(text) - len(stripped)
        answer, self._sent = text[self._sent :], len(text)
        return answer
