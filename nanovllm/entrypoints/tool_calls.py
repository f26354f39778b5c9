"""Tool calls on the chat endpoint: the constraint a tool_choice puts on the reply, and the calls in it.

With `tool_choice` naming a function the reply is constrained to that
function's parameters (a JSON object: the call's arguments); with "required",
to a JSON array of {"name", "parameters"} objects, one per call; both always
parse. With "auto" the model may write calls in the Hermes / Qwen format,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, between other text.
"""

import json
import re
import uuid
from dataclasses import dataclass

from nanovllm.sampling_params import StructuredOutputsParams

_TAGGED_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
TOOL_CALL_START = "<tool_call>"


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


def _parameters(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object"}


def named_function(tool_choice) -> str | None:
    """The function a tool_choice names ({"type": "function", "function": {"name": ...}}), else None."""
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


def tool_choice_constraint(tools: list[dict], tool_choice) -> StructuredOutputsParams | None:
    """What a named function or "required" constrains the reply to; None for "auto" and "none"."""
    name = named_function(tool_choice)
    if name is not None:
        tool = next((t for t in tools if t["function"]["name"] == name), None)
        if tool is None:
            raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools "
                             f"({', '.join(t['function']['name'] for t in tools)})")
        return StructuredOutputsParams(json=_parameters(tool))
    if tool_choice != "required":
        return None
    calls = [{"type": "object", "properties": {"name": {"enum": [t["function"]["name"]]}, "parameters": _parameters(t)},
              "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    return StructuredOutputsParams(json={"type": "array", "minItems": 1, "items": {"anyOf": calls}})


def parse_tool_calls(text: str, tool_choice) -> tuple[str | None, list[ToolCall]]:
    """The reply's content (None when it is all calls) and the calls in it. Text that should hold
    calls but does not parse (a reply cut short) stays content, with no calls."""
    name = named_function(tool_choice)
    try:
        if name is not None:
            json.loads(text)
            return None, [ToolCall(name, text)]
        if tool_choice == "required":
            return None, [ToolCall(call["name"], json.dumps(call["parameters"])) for call in json.loads(text)]
    except (json.JSONDecodeError, TypeError, KeyError):
        return text, []
    calls = []
    for body in _TAGGED_CALL.findall(text):
        try:
            call = json.loads(body)
            calls.append(ToolCall(call["name"], json.dumps(call.get("arguments", {}))))
        except (json.JSONDecodeError, TypeError, KeyError):
            return text, []
    if not calls:
        return text, []
    content = _TAGGED_CALL.sub("", text).strip()
    return content or None, calls
