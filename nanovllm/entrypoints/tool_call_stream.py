"""A streamed chat reply's tool calls, sent as vLLM streams them: a call's first delta brings its index, id,
type and name (with its arguments so far), each later one the arguments text added since, so that a client
joins each call's arguments from the deltas of its index."""

from collections.abc import Callable

from nanovllm.entrypoints.tool_call_formats import PartialCall


class ToolCallStream:
    """What one streamed reply has sent of its calls; `deltas` turns the calls so far into what is new.

    A call is sent once its name is whole, and calls go out in order: one
    whose name is not whole holds back those after it. Arguments that are not
    an extension of what was sent (a reply whose calls stopped parsing) send
    nothing more for that call.
    """

    def __init__(self, new_id: Callable[[], str]):
        self._new_id = new_id
        self._sent: list[str] = []  # per call sent: its arguments text sent so far

    def deltas(self, calls: list[PartialCall]) -> list[dict]:
        """The `tool_calls` delta entries that `calls` (the reply's calls so far, in order) bring."""
        entries = []
        for index, call in enumerate(calls):
            if index == len(self._sent):
                if call.name is None:
                    break
                self._sent.append(call.arguments)
                function = {"name": call.name, "arguments": call.arguments}
                entries.append({"index": index, "id": self._new_id(), "type": "function", "function": function})
                continue
            sent = self._sent[index]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                self._sent[index] = call.arguments
                entries.append({"index": index, "function": {"arguments": call.arguments[len(sent) :]}})
        return entries
