"""The ways models write tool calls into a reply, each under vLLM's `--tool-call-parser` name: where the calls
start (so that streamed content stops short of them) and the calls a whole reply holds.

- `hermes` (Hermes, Qwen2.5, Qwen3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` between
  other text.
- `qwen3_coder` (Qwen3-Coder, Qwen3.5, Qwen3.6): `<tool_call><function=NAME><parameter=KEY>value
  </parameter>...</function></tool_call>`, each value written as text and read back as the type the
  tool's JSON schema gives its parameter (text where the schema says none, or the value does not parse).
- `llama3_json` (Llama 3.1-3.3): the reply is the calls alone, `{"name": ..., "parameters": {...}}`,
  several joined by ";", after an optional `<|python_tag|>`.
- `mistral`: `[TOOL_CALLS]` then a JSON array of {"name", "arguments"} (tokenizers before v11), or
  `NAME[ARGS]{...}` per call, each behind its own `[TOOL_CALLS]` (v11 on); Mistral's templates take only
  ids of 9 letters and digits.
- `openai` (gpt-oss): harmony messages (`harmony.py`); a message to `functions.NAME` is a call, its content
  the arguments; the content is the final channel's (and plain text outside any message).

`<|python_tag|>`, `[TOOL_CALLS]` and harmony's tags are special tokens, which detokenizing drops by default: a
reply read with these formats keeps its special tokens (`keeps_special_tokens`). Text that does not parse as
calls stays content, with no calls.

Streamed, `partial_calls` reads the calls a reply so far has begun: each one's name once it is whole and its
arguments' JSON text as far as it is settled, a prefix of what the whole reply's call holds (the JSON formats'
arguments are the text the model wrote; qwen3_coder's are built parameter by parameter).
"""

import json
import random
import re
import string
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from nanovllm.entrypoints.harmony import read_messages
from nanovllm.entrypoints.partial_tags import partial_tag


def new_call_id() -> str:
    """A fresh tool-call id, as OpenAI's: "call_" and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or new_call_id()

    def as_openai(self, index: int | None = None) -> dict:
        """OpenAI's `tool_calls` entry (with `index`, the streamed delta's)."""
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


@dataclass
class PartialCall:
    """A call a reply so far has begun: its name (None until whole) and its arguments' JSON text so far."""

    name: str | None
    arguments: str = ""


class ToolCallFormat(ABC):
    """One way of writing tool calls: `start` opens them; `parse` reads a whole reply, `partial_calls` one
    so far."""

    name: str
    start: str
    keeps_special_tokens: bool = False

    def new_call_id(self) -> str:
        """A fresh id for a call in this format."""
        return new_call_id()

    def content_end(self, text: str) -> int:
        """How much of `text`, a reply so far, is surely content: all of it up to `start`, less a tail that
        may be the beginning of `start`."""
        end = text.find(self.start)
        return end if end >= 0 else len(text) - partial_tag(text, self.start)

    @abstractmethod
    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        """The reply's content (None when it is all calls) and its calls; `text` itself and no calls where
        what should be calls does not parse."""

    @abstractmethod
    def partial_calls(self, text: str, tools: list[dict]) -> list[PartialCall]:
        """The calls `text`, a reply so far, has begun, in order (stopping where it stops parsing)."""

    def _as_written(self, text: str, tools: list[dict], calls: list[ToolCall]) -> list[ToolCall]:
        """`calls` with their arguments as the reply wrote them (`as_written`)."""
        return as_written(calls, self.partial_calls(text, tools))


class Hermes(ToolCallFormat):
    """`<tool_call>` JSON `</tool_call>`, between other text."""

    name, start = "hermes", "<tool_call>"
    _call = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        calls = []
        for body in self._call.findall(text):
            try:
                call = json.loads(body)
                calls.append(ToolCall(call["name"], json.dumps(call.get("arguments", {}))))
            except (json.JSONDecodeError, TypeError, KeyError):
                return text, []
        return _with_calls(text, self._call, self._as_written(text, tools, calls))

    def partial_calls(self, text: str, tools: list[dict]) -> list[PartialCall]:
        calls = []
        for tag in re.finditer(re.escape(self.start), text):
            start = skip_chars(text, tag.end())
            if start == len(text) or text[start] != "{":
                break
            call, end = scan_call(text, start, ("arguments",))
            calls.append(call)
            if end is None:
                break
        return calls


class Qwen3Coder(ToolCallFormat):
    """`<tool_call><function=NAME>` then `<parameter=KEY>value</parameter>` per argument."""

    name, start = "qwen3_coder", "<tool_call>"
    _call = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", re.S)
    _parameter = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
    _function = re.compile(r"\s*<function=([^>\n]+)>")

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        if text.count(self.start) != len(self._call.findall(text)):
            return text, []  # a call that does not parse, or one cut short
        calls = [ToolCall(call.name, call.arguments) for call in self.partial_calls(text, tools)]
        return _with_calls(text, self._call, calls)

    def partial_calls(self, text: str, tools: list[dict]) -> list[PartialCall]:
        """Each call's arguments are "{", then each parameter whole, then "}" once `</function>` comes."""
        calls = []
        for tag in re.finditer(re.escape(self.start), text):
            function = self._function.match(text, tag.end())
            if function is None:
                break
            name = function.group(1).strip()
            end = text.find("</function>", function.end())
            types = _parameter_types(tools, name)
            pairs = [
                f"{json.dumps(key.strip(), ensure_ascii=False)}: "
                f"{json.dumps(_typed(_unwrapped(value), types.get(key.strip())), ensure_ascii=False)}"
                for key, value in self._parameter.findall(text, function.end(), len(text) if end < 0 else end)
            ]
            calls.append(PartialCall(name, "{" + ", ".join(pairs) + ("}" if end >= 0 else "")))
            if end < 0:
                break
        return calls


class Llama3Json(ToolCallFormat):
    """The reply as calls alone: JSON objects with "name" and "parameters", joined by ";"."""

    name, start, keeps_special_tokens = "llama3_json", "<|python_tag|>", True

    def content_end(self, text: str) -> int:
        """Nothing, where the reply so far may begin with calls; else all of it (calls come first or not at all)."""
        lead = text.lstrip()
        if lead.startswith("{") or self.start.startswith(lead) or lead.startswith(self.start):
            return 0
        return len(text)

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        rest = text.strip().removeprefix(self.start).lstrip()
        if not rest.startswith("{"):
            return text, []
        decoder, calls = json.JSONDecoder(), []
        while rest:
            try:
                call, end = decoder.raw_decode(rest)
                arguments = call["parameters"] if "parameters" in call else call["arguments"]
                calls.append(ToolCall(call["name"], json.dumps(arguments, ensure_ascii=False)))
            except (json.JSONDecodeError, TypeError, KeyError):
                return text, []
            rest = rest[end:].lstrip()
            if rest and not rest.startswith(";"):
                return text, []
            rest = rest.removeprefix(";").lstrip()
        return None, self._as_written(text, tools, calls)

    def partial_calls(self, text: str, tools: list[dict]) -> list[PartialCall]:
        calls = []
        at = skip_chars(text, 0)
        if text.startswith(self.start, at):
            at += len(self.start)
        while True:
            at = skip_chars(text, at)
            if at == len(text) or text[at] != "{":
                return calls
            call, end = scan_call(text, at, ("parameters", "arguments"))
            calls.append(call)
            if end is None:
                return calls
            at = skip_chars(text, end)
            if not text.startswith(";", at):
                return calls
            at += 1


class Mistral(ToolCallFormat):
    """`[TOOL_CALLS]` then a JSON array of calls, or `NAME[ARGS]{...}` behind each `[TOOL_CALLS]`."""

    name, start, keeps_special_tokens = "mistral", "[TOOL_CALLS]", True

    def new_call_id(self) -> str:
        """9 letters and digits, the only ids Mistral's chat templates take."""
        return "".join(random.choices(string.ascii_letters + string.digits, k=9))

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        first = text.find(self.start)
        if first < 0:
            return text, []
        parts = [part.strip() for part in text[first:].split(self.start)[1:]]
        try:
            calls = self._array(parts[0]) if parts[0].startswith("[") and len(parts) == 1 else self._named(parts)
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            return text, []
        content = text[:first].strip()
        return content or None, self._as_written(text, tools, calls)

    def partial_calls(self, text: str, tools: list[dict]) -> list[PartialCall]:
        first = text.find(self.start)
        if first < 0:
            return []
        at = skip_chars(text, first + len(self.start))
        if text.startswith("[", at):
            return partial_array_calls(text, at + 1, ("arguments",))
        calls = []
        for part in text[first:].split(self.start)[1:]:
            name_end = part.find("[ARGS]")
            if name_end < 0:
                break
            value = skip_chars(part, name_end + len("[ARGS]"))
            end = _value_end(part, value)
            calls.append(PartialCall(part[:name_end].strip(), part[value:end]))
            if end is None:
                break
        return calls

    def _array(self, part: str) -> list[ToolCall]:
        return [_mistral_call(call["name"], call["arguments"]) for call in json.loads(part)]

    def _named(self, parts: list[str]) -> list[ToolCall]:
        calls = []
        for part in parts:
            name, arguments = part.split("[ARGS]", 1)
            calls.append(_mistral_call(name.strip(), json.loads(arguments)))
        return calls


class Harmony(ToolCallFormat):
    """gpt-oss's harmony messages: those addressed to `functions.NAME` are calls."""

    name, start, keeps_special_tokens = "openai", "<|", True

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        messages = read_messages(text, whole=True)
        calls = [ToolCall(m.called_function, m.content) for m in messages if m.called_function]
        if not calls:
            return text, []
        plain = text[: text.find(self.start)] if self.start in text else text
        content = plain + "".join(m.content for m in messages if m.channel == "final")
        return content.strip() or None, calls

    def partial_calls(self, text: str, tools: list[dict]) -> list[PartialCall]:
        return [PartialCall(m.called_function, m.content) for m in read_messages(text) if m.called_function]


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array"}
_JSON_TYPES[type(None)] = "null"

FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (Hermes(), Qwen3Coder(), Llama3Json(), Mistral(), Harmony())}


_LITERAL = re.compile(r"[^,}\]\s]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def skip_chars(text: str, at: int, chars: str = " \t\r\n") -> int:
    """The first index from `at` whose character is not one of `chars` (len(text) if none)."""
    while at < len(text) and text[at] in chars:
        at += 1
    return at


def _value_end(text: str, start: int) -> int | None:
    """The index past the JSON value that starts at `text[start]` (None: it does not end within `text`)."""
    if start >= len(text):
        return None
    if text[start] == '"':
        string = _STRING.match(text, start)
        return None if string is None else string.end()
    if text[start] not in "{[":
        literal = _LITERAL.match(text, start)  # a number, true, false or null: it ends where a delimiter comes
        return literal.end() if literal.end() < len(text) else None
    depth, at = 0, start
    while at < len(text):
        if text[at] == '"':
            string = _STRING.match(text, at)
            if string is None:
                return None
            at = string.end()
            continue
        if text[at] in "{[":
            depth += 1
        elif text[at] in "}]":
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    return None


def scan_call(text: str, start: int, argument_keys: tuple[str, ...]) -> tuple[PartialCall, int | None]:
    """The call of the JSON object that opens at `text[start]`, as far as `text` goes: its "name" once that
    string is whole, the text of the first of `argument_keys` it holds as far as written; and the index past
    the object (None: it does not end within `text`, or stops parsing)."""
    name, found, at = None, {}, start + 1

    def so_far(end: int | None) -> tuple[PartialCall, int | None]:
        arguments = next((found[key] for key in argument_keys if key in found), "")
        return PartialCall(name, arguments), end

    while True:
        at = skip_chars(text, at, " \t\r\n,")
        if at < len(text) and text[at] == "}":
            return so_far(at + 1)
        key_end = _value_end(text, at) if at < len(text) and text[at] == '"' else None
        if key_end is None:
            return so_far(None)
        key = json.loads(text[at:key_end])
        at = skip_chars(text, key_end)
        if not text.startswith(":", at):
            return so_far(None)
        value = skip_chars(text, at + 1)
        end = _value_end(text, value)
        if key == "name" and end is not None:
            name = json.loads(text[value:end])
            name = name if isinstance(name, str) else None
        elif key in argument_keys and key not in found:
            found[key] = text[value:end]
        if end is None:
            return so_far(None)
        at = end


def partial_array_calls(text: str, at: int, argument_keys: tuple[str, ...]) -> list[PartialCall]:
    """The calls of a JSON array of {"name", one of `argument_keys`} objects, as far as written, the first
    object starting at `at` (past the "[") or later."""
    calls = []
    while True:
        at = skip_chars(text, at, " \t\r\n,")
        if at == len(text) or text[at] != "{":
            return calls
        call, end = scan_call(text, at, argument_keys)
        calls.append(call)
        if end is None:
            return calls
        at = end


def as_written(calls: list[ToolCall], partial: list[PartialCall]) -> list[ToolCall]:
    """`calls` with each one's arguments as its `partial` call streamed them, where that text is the same JSON
    value (the text the model wrote, rather than the value written again)."""
    for call, written in zip(calls, partial):
        if written.arguments != call.arguments and _same_json(written.arguments, call.arguments):
            call.arguments = written.arguments
    return calls


def _same_json(a: str, b: str) -> bool:
    """Whether two texts spell the same JSON value."""
    try:
        return json.loads(a) == json.loads(b)
    except json.JSONDecodeError:
        return False


def _with_calls(text: str, pattern: re.Pattern, calls: list[ToolCall]) -> tuple[str | None, list[ToolCall]]:
    """The content left once `pattern`'s calls are cut out of `text`, and the calls (none: `text` as it is)."""
    if not calls:
        return text, []
    content = pattern.sub("", text).strip()
    return content or None, calls


def _parameter_types(tools: list[dict], name: str) -> dict[str, str]:
    """The JSON-schema type of each parameter of the tool named `name` (none where it gives no type)."""
    tool = next((t for t in tools if t.get("function", {}).get("name") == name), None)
    properties = ((tool or {}).get("function", {}).get("parameters") or {}).get("properties") or {}
    return {
        key: spec["type"]
        for key, spec in properties.items()
        if isinstance(spec, dict) and isinstance(spec.get("type"), str)
    }


def _unwrapped(value: str) -> str:
    """A parameter's value without the newline the format writes on each side of it."""
    return value.removeprefix("\n").removesuffix("\n")


def _typed(value: str, kind: str | None):
    """`value` read as the JSON-schema type `kind`: text for "string", else the JSON it spells where that is of
    the type (any type where `kind` is None; an integer for "number" too), else the text itself."""
    if kind == "string":
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    found = _JSON_TYPES[type(parsed)]
    return parsed if kind in (None, found) or (kind, found) == ("number", "integer") else value


def _mistral_call(name: str, arguments) -> ToolCall:
    """A call with an id of Mistral's form."""
    if not name:
        raise ValueError("a call without a name")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(name, text, FORMATS["mistral"].new_call_id())
