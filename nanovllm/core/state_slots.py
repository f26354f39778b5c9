"""Recurrent-state slots: which slot holds whose state, and the snapshots the prefix cache keeps.

A recurrent layer keeps one state per sequence, updated in place at every
token, so a running request owns a slot (`Request.state_slot`) in every
recurrent layer's state tensor. With prefix caching it also owns, where one can
be had, a second one (`snapshot_slot`) that holds its state as of its latest
block boundary (`snapshot_tokens`): a step that ends on a boundary copies the
live state there. When the request finishes or is preempted, that snapshot goes
to the prefix cache under the hash of the prefix it ends (the chained hash of
its last block); a later request whose prefix matches starts from a copy of it.
Two prompt positions are cached at once, in a slot of their own: where a prompt's
last block ends, since a later turn of a chat resends the prompt (its answer may
come back as other tokens), and where the cache holds a request's KV blocks
beyond the snapshot it starts from (a prefix other requests share, a system
prompt say, ends there or later). Such a snapshot is found once the copies of
its step are handed over: a request admitted in that same step restores its
state before the forward pass that computes it.

Running comes first: a new request takes a free slot, else a cached
snapshot's (least recently used first), else a running request's snapshot slot
(the one holding the fewest tokens), so that as many requests run as there are
slots. A request left without a snapshot slot takes one again at a later
boundary where one is free or cached.

The device work is a list of copies per step, which the model runner runs:
`restores` before the step's forward pass (a cached snapshot, or zeros, into a
new request's live slot) and `snapshots` after it (live slot into snapshot
slot).
"""

from collections import OrderedDict
from dataclasses import dataclass

from nanovllm.core.request import Request

SLOTS_PER_SEQUENCE = 2  # the slots a running request holds with prefix caching: its live state and its snapshot
NO_SLOT = -1  # a request's slot where it holds none
# the source of a restore that zeroes its slot: the request starts from the empty state
ZERO_STATE = -1


@dataclass
class _Snapshot:
    """A cached snapshot: its slot, and the tokens of the block it ends (a guard against hash collisions)."""

    slot: int
    last_block: list[int]


class StateSlots:
    """The pool of `num_slots` state slots: one or two per running request (its live state, and its snapshot
    where it has one), the rest cached snapshots or free."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.free_slots: list[int] = list(range(num_slots - 1, -1, -1))
        self.cached: OrderedDict[int, _Snapshot] = OrderedDict()  # prefix hash -> snapshot, oldest use first
        self.snapshot_holders: dict[int, Request] = {}  # snapshot slot -> the running request it belongs to
        self.fresh: dict[int, _Snapshot] = {}  # cached by the step being scheduled: found once it is handed over
        self.restores: list[tuple[int, int]] = []  # (source slot or ZERO_STATE, live slot), before the forward
        self.snapshots: list[tuple[int, int]] = []  # (live slot, snapshot slot), after the forward

    def snapshot_at(self, prefix_hash: int, last_block: list[int]) -> int:
        """The slot of the cached snapshot of the prefix whose chained hash is `prefix_hash` and whose last
        block holds `last_block`, or ZERO_STATE."""
        snapshot = _matching(self.cached, prefix_hash, last_block)
        return ZERO_STATE if snapshot is None else snapshot.slot

    def is_fresh(self, prefix_hash: int, last_block: list[int]) -> bool:
        """Whether the step being scheduled caches the state after the prefix whose chained hash is `prefix_hash`
        and whose last block holds `last_block`."""
        return _matching(self.fresh, prefix_hash, last_block) is not None

    def can_admit(self, source: int) -> bool:
        """Whether a live slot can be found for a new request, keeping the snapshot in `source` it starts from."""
        return len(self.free_slots) + len(self.cached) - (source != ZERO_STATE) + len(self.snapshot_holders) >= 1

    def admit(self, req: Request, source: int, with_snapshot: bool) -> None:
        """Give `req` its live slot, and with `with_snapshot` a snapshot slot where one is free or cached; its
        live state starts as a copy of `source` (a cached snapshot, which is used again and so moves to the
        back of the eviction queue) or zeros."""
        req.state_slot = self._take(keep=source)
        if req.state_slot == NO_SLOT:
            req.state_slot = self._take_from_running()
        req.snapshot_slot = self._take(keep=source) if with_snapshot else NO_SLOT
        if req.snapshot_slot != NO_SLOT:
            self.snapshot_holders[req.snapshot_slot] = req
        req.snapshot_tokens = 0
        self.restores.append((source, req.state_slot))
        for prefix_hash, snapshot in self.cached.items():
            if snapshot.slot == source:
                self.cached.move_to_end(prefix_hash)
                break

    def snapshot(self, req: Request, num_tokens: int) -> None:
        """After the step now scheduled, `req`'s state is that of its first `num_tokens` tokens, a block
        boundary: copy it to the request's snapshot slot (taking one first where it has none and one is free
        or cached; else no snapshot is taken)."""
        if req.snapshot_slot == NO_SLOT:
            req.snapshot_slot = self._take(keep=ZERO_STATE)
            if req.snapshot_slot == NO_SLOT:
                return
            self.snapshot_holders[req.snapshot_slot] = req
        self.snapshots.append((req.state_slot, req.snapshot_slot))
        req.snapshot_tokens = num_tokens

    def cache_now(self, req: Request, prefix_hash: int, last_block: list[int]) -> None:
        """After the step now scheduled, `req`'s state is that of a prefix of confirmed tokens whose chained hash
        is `prefix_hash` and whose last block holds `last_block`: cache a copy of it in a slot of its own (a
        free one or a cached snapshot's), unless it is cached already or no such slot is left."""
        if prefix_hash in self.cached or prefix_hash in self.fresh:
            return
        slot = self._take(keep=ZERO_STATE)
        if slot != NO_SLOT:
            self.snapshots.append((req.state_slot, slot))
            self.fresh[prefix_hash] = _Snapshot(slot, last_block)

    def release(self, req: Request, prefix_hash: int | None, last_block: list[int]) -> None:
        """Take `req`'s slots back: its live one is freed, its snapshot cached under `prefix_hash` (None: its
        snapshot is of no use, freed too)."""
        self.free_slots.append(req.state_slot)
        if req.snapshot_slot != NO_SLOT:
            del self.snapshot_holders[req.snapshot_slot]
            if prefix_hash is None or prefix_hash in self.cached or prefix_hash in self.fresh:
                self.free_slots.append(req.snapshot_slot)
            else:
                self.cached[prefix_hash] = _Snapshot(req.snapshot_slot, last_block)
        req.state_slot = req.snapshot_slot = NO_SLOT
        req.snapshot_tokens = 0

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The restores and snapshots of the step being scheduled, handed over once; the snapshots it cached
        can be found from now on."""
        self.cached.update(self.fresh)
        self.fresh = {}
        copies = (self.restores, self.snapshots)
        self.restores, self.snapshots = [], []
        return copies

    def _take(self, keep: int) -> int:
        """A free slot, else the slot of the least recently used cached snapshot other than `keep`, else
        NO_SLOT."""
        if self.free_slots:
            return self.free_slots.pop()
        for prefix_hash, snapshot in self.cached.items():
            if snapshot.slot != keep:
                del self.cached[prefix_hash]
                return snapshot.slot
        return NO_SLOT

    def _take_from_running(self) -> int:
        """The snapshot slot of the running request whose snapshot holds the fewest tokens: it goes on
        without one, and the copy into that slot this step would have made is dropped."""
        assert self.snapshot_holders, "no state slot to take: can_admit was not asked"
        slot, holder = min(self.snapshot_holders.items(), key=lambda item: item[1].snapshot_tokens)
        del self.snapshot_holders[slot]
        holder.snapshot_slot = NO_SLOT
        holder.snapshot_tokens = 0
        self.snapshots = [copy for copy in self.snapshots if copy[1] != slot]
        return slot


def _matching(snapshots: dict[int, _Snapshot], prefix_hash: int, last_block: list[int]) -> _Snapshot | None:
    """The snapshot of `snapshots` under `prefix_hash` whose last block holds `last_block`, else None."""
    snapshot = snapshots.get(prefix_hash)
    return snapshot if snapshot is not None and snapshot.last_block == last_block else None
