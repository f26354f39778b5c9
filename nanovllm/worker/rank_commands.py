"""What rank 0 sends the other ranks of a tensor-parallel engine, as bytes: each step, and calls by name.

A step is the scheduler's output less what only the sampling rank reads
(`SchedulerOutput.without_sampling`), msgpack-encoded, with only the block
tables that changed since the step before: a decode step's message then has
the same few bytes per request at any context length, where whole tables grow
with it (a 256-sequence decode step at 16k tokens of context took 1.3 MB and
18 ms to pickle and unpickle on a CPU core), and only the requests that
crossed a block boundary pay for theirs. A changed request's update is, per
cache group, [lead, lead_to, kept, *appended]: keep the first `kept` entries
of the table the rank holds, give back (NO_BLOCK) entries lead..lead_to, then
append. That is exact as long as a request's tables change between its steps
only as the KV cache manager changes them: blocks appended, a leading run
given back (NO_BLOCK), or all of them replaced by a new list of new tables
(admission after a preemption); rank 0 finds what changed from the list's
identity, the tables' lengths and one entry of each, in a few operations
per request. Tables go whole when they are a new list or their request was
not in the step before. Both ends keep the tables of the step before only, so the
ranks must decode every step, in order.

Anything else is a pickled (method name, args) call.
"""

import pickle
from operator import getitem

import msgspec

from nanovllm.core.kv_cache_manager import NO_BLOCK, given_back_run_end
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.sample.metadata import DecodeDraw

_STEP, _CALL = b"S", b"C"


class _TableUpdate(msgspec.Struct, array_like=True, gc=False):
    """The tables of the step's request `index` that changed: per cache group [lead, lead_to, kept, *appended]."""

    index: int
    groups: list[list[int]]


class _Step(msgspec.Struct, array_like=True, gc=False):
    """A step less its block tables, the updates that rebuild them from the step before's, and how its rows
    are drawn inside the decode step (None where they are not)."""

    out: SchedulerOutput
    table_updates: list[_TableUpdate]
    draw: DecodeDraw | None


def encode_call(method: str, *args) -> bytes:
    """A call of `method` on every other rank's runner, with `args` (pickled)."""
    return _CALL + pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)


class CommandEncoder:
    """Rank 0's side: the bytes of each step (`step`), which remember the block tables sent in the step before."""

    def __init__(self):
        self._encoder = msgspec.msgpack.Encoder()
        # per request of the step before: its list of tables, and per table the entries sent, the entries given
        # back, and the entry to look at for more given back (the first kept, or the last when none is)
        self._sent: dict[str, tuple[list[list[int]], tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}

    def step(self, out: SchedulerOutput, draw: DecodeDraw | None) -> bytes:
        """The bytes of `out` for the ranks that do not sample: 'run_step' with the step less its sampling
        settings, block tables as updates, and its `draw` (`ModelRunner.plan_draw`)."""
        message = out.without_sampling()
        message.block_tables = []
        return _STEP + self._encoder.encode(_Step(message, self._table_updates(out), draw))

    def _table_updates(self, out: SchedulerOutput) -> list[_TableUpdate]:
        sent, self._sent = self._sent, {}
        updates = []
        for index, (req_id, tables) in enumerate(zip(out.req_ids, out.block_tables)):
            held = sent.get(req_id)
            if (
                held is not None
                and held[0] is tables
                and held[1] == tuple(map(len, tables))
                and NO_BLOCK not in map(getitem, tables, held[3])
            ):
                self._sent[req_id] = held  # the most common case, a decode step within its last block: no update
                continue
            groups, leads = [], []
            for g, table in enumerate(tables):
                kept = lead = 0
                if held is not None and held[0] is tables:
                    kept, lead = min(held[1][g], len(table)), held[2][g]
                lead_to = given_back_run_end(table, lead, len(table))
                groups.append([lead, min(lead_to, kept), kept, *table[kept:]])
                leads.append(lead_to)
            updates.append(_TableUpdate(index, groups))
            lengths = tuple(map(len, tables))
            if all(lengths):  # an empty table has no entry to look at: it goes whole next time
                probes = tuple(min(lead, length - 1) for lead, length in zip(leads, lengths))
                self._sent[req_id] = (tables, lengths, tuple(leads), probes)
        return updates


class CommandDecoder:
    """A rank's side: (method name, args) of each command, the steps' block tables rebuilt from their updates."""

    def __init__(self):
        self._decoder = msgspec.msgpack.Decoder(_Step)
        self._tables: dict[str, list[list[int]]] = {}  # per request of the step before, its tables

    def decode(self, data: bytes) -> tuple[str, tuple]:
        """(method name, args) of a command's bytes."""
        body = memoryview(data)[1:]
        if data[:1] == _CALL:
            return pickle.loads(body)
        assert data[:1] == _STEP, f"unknown command kind {data[:1]!r}"
        step = self._decoder.decode(body)
        step.out.block_tables = self._apply(step.out.req_ids, step.table_updates)
        return "run_step", (step.out, step.draw)

    def _apply(self, req_ids: list[str], updates: list[_TableUpdate]) -> list[list[list[int]]]:
        tables = list(map(self._tables.get, req_ids))  # a request without an update has its tables of the step before
        for update in updates:
            held = tables[update.index] or []
            tables[update.index] = [
                _updated(held[g] if g < len(held) else None, group) for g, group in enumerate(update.groups)
            ]
        self._tables = dict(zip(req_ids, tables))
        return tables


def _updated(table: list[int] | None, update: list[int]) -> list[int]:
    """`table` (None: none held) with `update` ([lead, lead_to, kept, *appended]) applied, in place where kept."""
    lead, lead_to, kept, *appended = update
    table = table if kept else []
    del table[kept:]
    table[lead:lead_to] = [NO_BLOCK] * (lead_to - lead)
    table.extend(appended)
    return table
