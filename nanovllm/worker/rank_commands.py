"""What rank 0 sends the other ranks of a tensor-parallel engine, as bytes: each step, and calls by name.

A step is the scheduler's output less what only the sampling rank reads
(`SchedulerOutput.without_sampling`), msgpack-encoded, whose block tables
carry only what changed since the step before: a decode step's message then
has the same few bytes per request at any context length, where whole tables
grow with it (a 256-sequence decode step at 16k tokens of context took 1.2 MB
and 17 ms to pickle and unpickle on a CPU core). Per request and cache group
the update is [lead, lead_to, kept, *appended]: keep the first `kept` entries
of the table the rank holds, give back (NO_BLOCK) entries lead..lead_to, then
append. That is exact as long as a request's table changes between its steps
only as the KV cache manager changes it: blocks appended, a leading run given
back (NO_BLOCK), or the whole list replaced by a new one (admission after a
preemption); a table sent whole when it is a new list, or its request was not
in the step before. Both ends keep the tables of the step before only, so
the ranks must decode every step, in order.

Anything else is a pickled (method name, args) call.
"""

import pickle

import msgspec

from nanovllm.core.kv_cache_manager import NO_BLOCK
from nanovllm.core.scheduler_output import SchedulerOutput

_STEP, _CALL = b"S", b"C"


def encode_call(method: str, *args) -> bytes:
    """A call of `method` on every other rank's runner, with `args` (pickled)."""
    return _CALL + pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)


def _leading_run(table: list[int], start: int) -> int:
    """Where the leading run of given-back entries of `table` ends, known to reach `start` at least."""
    low, high = start, len(table)
    if low == high or table[low] != NO_BLOCK:
        return low
    while low < high:
        mid = (low + high) // 2
        if table[mid] == NO_BLOCK:
            low = mid + 1
        else:
            high = mid
    return low


class CommandEncoder:
    """Rank 0's side: the bytes of each step (`step`), which remember the block tables sent in the step before."""

    def __init__(self):
        self._encoder = msgspec.msgpack.Encoder()
        # per request of the step before, per cache group: (its table, entries sent, entries given back)
        self._sent: dict[str, list[tuple[list[int], int, int]]] = {}

    def step(self, out: SchedulerOutput) -> bytes:
        """The bytes of `out` for the ranks that do not sample: 'execute' with the step less its sampling
        settings, block tables as updates."""
        message = out.without_sampling()
        message.block_tables = self._table_updates(out)
        return _STEP + self._encoder.encode(message)

    def _table_updates(self, out: SchedulerOutput) -> list[list[list[int]]]:
        sent, self._sent = self._sent, {}
        updates = []
        for req_id, tables in zip(out.req_ids, out.block_tables):
            before = sent.get(req_id, ())
            now, update = [], []
            for g, table in enumerate(tables):
                kept = lead = 0
                if g < len(before) and before[g][0] is table:
                    _, length, lead = before[g]
                    kept = min(length, len(table))
                lead_to = _leading_run(table, lead)
                update.append([lead, min(lead_to, kept), kept, *table[kept:]])
                now.append((table, len(table), lead_to))
            self._sent[req_id] = now
            updates.append(update)
        return updates


class CommandDecoder:
    """A rank's side: (method name, args) of each command, the steps' block tables rebuilt from their updates."""

    def __init__(self):
        self._decoder = msgspec.msgpack.Decoder(SchedulerOutput)
        self._tables: dict[str, list[list[int]]] = {}  # per request of the step before, its tables

    def decode(self, data: bytes) -> tuple[str, tuple]:
        """(method name, args) of a command's bytes."""
        body = memoryview(data)[1:]
        if data[:1] == _CALL:
            return pickle.loads(body)
        assert data[:1] == _STEP, f"unknown command kind {data[:1]!r}"
        out = self._decoder.decode(body)
        out.block_tables = self._apply(out.req_ids, out.block_tables)
        return "execute", (out,)

    def _apply(self, req_ids: list[str], updates: list[list[list[int]]]) -> list[list[list[int]]]:
        before, self._tables = self._tables, {}
        for req_id, update in zip(req_ids, updates):
            held = before.get(req_id)
            tables = []
            for g, (lead, lead_to, kept, *appended) in enumerate(update):
                table = held[g] if kept else []
                del table[kept:]
                table[lead:lead_to] = [NO_BLOCK] * (lead_to - lead)
                table.extend(appended)
                tables.append(table)
            self._tables[req_id] = tables
        return list(self._tables.values())
