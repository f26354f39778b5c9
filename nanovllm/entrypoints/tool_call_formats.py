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

`<|python_tag|>` and `[TOOL_CALLS]` are special tokens, which detokenizing drops by default: a reply read
with these formats keeps its special tokens (`keeps_special_tokens`). Text that does not parse as calls
stays content, with no calls.
"""

import json
import random
import re
import string
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from nanovllm.entrypoints.partial_tags import partial_tag


@dataclass
class ToolCall:
    """One call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def as_openai(self, index: int | None = None) -> dict:
        """OpenAI's `tool_calls` entry (with `index`, the streamed delta's)."""
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


class ToolCallFormat(ABC):
    """One way of writing tool calls: `start` opens them; `parse` reads a whole reply."""

    name: str
    start: str
    keeps_special_tokens: bool = False

    def content_end(self, text: str) -> int:
        """How much of `text`, a reply so far, is surely content: all of it up to `start`, less a tail that
        may be the beginning of `start`."""
        end = text.find(self.start)
        return end if end >= 0 else len(text) - partial_tag(text, self.start)

    @abstractmethod
    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        """The reply's content (None when it is all calls) and its calls; `text` itself and no calls where
        what should be calls does not parse."""


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
        return _with_calls(text, self._call, calls)


class Qwen3Coder(ToolCallFormat):
    """`<tool_call><function=NAME>` then `<parameter=KEY>value</parameter>` per argument."""

    name, start = "qwen3_coder", "<tool_call>"
    _call = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", re.S)
    _parameter = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[ToolCall]]:
        if text.count(self.start) != len(self._call.findall(text)):
            return text, []  # a call that does not parse, or one cut short
        calls = []
        for name, body in self._call.findall(text):
            name = name.strip()
            types = _parameter_types(tools, name)
            arguments = {
                key.strip(): _typed(_unwrapped(value), types.get(key.strip()))
                for key, value in self._parameter.findall(body)
            }
            calls.append(ToolCall(name, json.dumps(arguments, ensure_ascii=False)))
        return _with_calls(text, self._call, calls)


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
        return None, calls


class Mistral(ToolCallFormat):
    """`[TOOL_CALLS]` then a JSON array of calls, or `NAME[ARGS]{...}` behind each `[TOOL_CALLS]`."""

    name, start, keeps_special_tokens = "mistral", "[TOOL_CALLS]", True

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
        return content or None, calls

    def _array(self, part: str) -> list[ToolCall]:
        return [_mistral_call(call["name"], call["arguments"]) for call in json.loads(part)]

    def _named(self, parts: list[str]) -> list[ToolCall]:
        calls = []
        for part in parts:
            name, arguments = part.split("[ARGS]", 1)
            calls.append(_mistral_call(name.strip(), json.loads(arguments)))
        return calls


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array"}
_JSON_TYPES[type(None)] = "null"

FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (Hermes(), Qwen3Coder(), Llama3Json(), Mistral())}


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
    """A call with an id of 9 letters and digits, the only ids Mistral's chat templates take."""
    if not name:
        raise ValueError("a call without a name")
    call_id = "".join(random.choices(string.ascii_letters + string.digits, k=9))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(name, text, call_id)
