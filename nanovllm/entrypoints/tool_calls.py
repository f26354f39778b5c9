"""Tool calls on the chat endpoint: the constraint a tool_choice puts on the reply, and the calls in it.

With `tool_choice` naming a function the reply is constrained to that
function's parameters (a JSON object: the call's arguments); with "required",
to a JSON array of {"name", "parameters"} objects, one per call; both parse
unless the reply was cut short by its token limit. With "auto" the model may
write calls in the format of the server's `--tool-call-parser`
(`tool_call_formats.py`), between other text. `partial_tool_calls` reads the
calls of a reply so far, for streaming: a forced call's arguments are the text
written so far (a named function's) or each "parameters" value as written
("required"), as the whole reply's calls hold them.
"""

import json
import re

from nanovllm.entrypoints.tool_call_formats import (
    FORMATS,
    PartialCall,
    ToolCall,
    ToolCallFormat,
    as_written,
    partial_array_calls,
    skip_chars,
)
from nanovllm.sampling_params import StructuredOutputsParams

# the start of a "required" call cut short: its complete name, then the parameters as far as they got
_CUT_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*(?:,\s*"parameters"\s*:\s*(.*))?', re.S)


def _parameters(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object"}


def named_function(tool_choice) -> str | None:
    """The function a tool_choice names ({"type": "function", "function": {"name": ...}}), else None."""
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


def tool_choice_constraint(tools: list[dict], tool_choice, parallel: bool = True) -> StructuredOutputsParams | None:
    """What a named function or "required" constrains the reply to (with `parallel` false, "required"
    allows one call only); None for "auto" and "none"."""
    name = named_function(tool_choice)
    if name is not None:
        tool = next((t for t in tools if t["function"]["name"] == name), None)
        if tool is None:
            raise ValueError(
                f"tool_choice names the function {name!r}, which is not among the tools "
                f"({', '.join(t['function']['name'] for t in tools)})"
            )
        return StructuredOutputsParams(json=_parameters(tool))
    if tool_choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"enum": [t["function"]["name"]]}, "parameters": _parameters(t)},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return StructuredOutputsParams(json=array if parallel else {**array, "maxItems": 1})


def parse_tool_calls(
    text: str,
    tool_choice,
    cut: bool = False,
    parallel: bool = True,
    fmt: ToolCallFormat = FORMATS["hermes"],
    tools: list[dict] = (),
) -> tuple[str | None, list[ToolCall]]:
    """The reply's content (None when it is all calls) and the calls in it; with `parallel` false only
    the first call. "auto" calls are read in `fmt` (`--tool-call-parser`), given the request's `tools`.

    A forced call (a named function or "required") whose reply was `cut` short
    by the token limit is still returned as calls, arguments as far as they
    got: for a named function one call with the partial JSON text; for
    "required" every call written whole, then the one being written if its
    name is complete (its arguments the partial JSON text after
    `"parameters":`, possibly empty). Text that should hold calls but does not
    parse otherwise stays content, with no calls (as does an "auto" call cut
    short).
    """
    name = named_function(tool_choice)
    if name is not None:
        return _named_call(text, name, cut)
    if tool_choice == "required":
        content, calls = _required_calls(text, cut)
    else:
        content, calls = fmt.parse(text, list(tools))
    return (content, calls) if parallel else (content, calls[:1])


def partial_tool_calls(
    text: str, tool_choice, parallel: bool = True, fmt: ToolCallFormat = FORMATS["hermes"], tools: list[dict] = ()
) -> list[PartialCall]:
    """The calls `text`, a reply so far, has begun (`parse_tool_calls`'s, as far as written)."""
    name = named_function(tool_choice)
    if name is not None:
        calls = [PartialCall(name, text)]
    elif tool_choice == "required":
        calls = _partial_required_calls(text)
    else:
        calls = fmt.partial_calls(text, list(tools))
    return calls if parallel else calls[:1]


def _partial_required_calls(text: str) -> list[PartialCall]:
    """The calls of a JSON array of {"name", "parameters"} objects, as far as written."""
    at = skip_chars(text, 0)
    return partial_array_calls(text, at + 1, ("parameters",)) if text.startswith("[", at) else []


def _named_call(text: str, name: str, cut: bool) -> tuple[str | None, list[ToolCall]]:
    if not cut:
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return text, []
    return None, [ToolCall(name, text)]


def _required_calls(text: str, cut: bool) -> tuple[str | None, list[ToolCall]]:
    """The calls of a JSON array of {"name", "parameters"} objects; cut short, those that are whole plus
    the one being written if its name is."""
    decoder = json.JSONDecoder()
    rest = text.lstrip()
    if not rest.startswith("["):
        return text, []
    calls, rest = [], rest[1:]
    while True:
        rest = rest.lstrip().removeprefix(",").lstrip()
        if rest.startswith("]") or not rest:
            break
        try:
            call, end = decoder.raw_decode(rest)
            calls.append(ToolCall(call["name"], json.dumps(call["parameters"])))
        except (json.JSONDecodeError, TypeError, KeyError):
            calls = calls + _cut_call(rest) if cut else []
            return (None, calls) if calls else (text, [])
        rest = rest[end:]
    if not calls or (not cut and rest.strip() != "]"):
        return text, []
    return None, as_written(calls, _partial_required_calls(text))


def _cut_call(text: str) -> list[ToolCall]:
    """The call `text` (one cut short) was writing, if it got as far as a complete name."""
    match = _CUT_CALL.match(text)
    if match is None:
        return []
    return [ToolCall(json.loads(match.group(1)), (match.group(2) or "").rstrip())]
