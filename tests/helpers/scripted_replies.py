"""Chat replies scripted piece by piece on a running test server, whatever its tiny model generates, and the
requests that read them whole and streamed."""

import json
from collections.abc import Callable

import httpx

from nanovllm.frontend import detokenizer

from helpers.api_servers import MODEL


def scripted_replies(monkeypatch) -> Callable[[list[str]], int]:
    """A function that makes the next replies read as the pieces it is given, one per generated token (then
    nothing), and returns their number (the max_tokens that reads them all)."""
    pieces = []

    def step(self, token_ids):
        start = self.__dict__.setdefault("scripted", 0)
        self.scripted += len(token_ids)
        return "".join(pieces[start : self.scripted])

    monkeypatch.setattr(detokenizer.IncrementalDetokenizer, "step", step)

    def set_pieces(new: list[str]) -> int:
        pieces[:] = new
        return len(new)

    return set_pieces


def chat(server, max_tokens: int, stream: bool = False, **fields) -> httpx.Response:
    """A greedy chat completion of `max_tokens` tokens (EOS ignored) on `server`, asserted to succeed."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "w5 w6"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **fields,
    }
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response


def deltas(response: httpx.Response) -> list[dict]:
    """The choice deltas of a streamed chat response."""
    payloads = [line[6:] for line in response.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    return [json.loads(payload)["choices"][0] for payload in payloads]


def joined_tool_calls(entries: list[dict]) -> list[dict]:
    """The calls a client makes of a stream's `tool_calls` delta entries (in order): per index, the id, type
    and name of its first entry, and the arguments of all of them joined; asserts that an index's first entry
    names the call and no later one does."""
    calls: dict[int, dict] = {}
    for entry in entries:
        function = entry["function"]
        if entry["index"] not in calls:
            assert entry.get("id") and function.get("name"), entry
            calls[entry["index"]] = {"id": entry["id"], "name": function["name"], "arguments": ""}
        else:
            assert not entry.get("id") and not function.get("name"), entry
        calls[entry["index"]]["arguments"] += function.get("arguments") or ""
    assert sorted(calls) == list(range(len(calls)))
    return [calls[index] for index in sorted(calls)]
