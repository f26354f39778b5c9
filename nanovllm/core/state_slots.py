"""Recurrent-state slots: which slot holds whose state, and the snapshots the prefix cache keeps.

A recurrent layer keeps one state per sequence, updated in place at every
token, so a running request owns a slot (`Request.state_slot`) in every
recurrent layer's state tensor. It owns a second one (`snapshot_slot`) that
holds its state as of its latest block boundary (`snapshot_tokens`): a step that
ends on a boundary copies the live state there. When the request finishes or is
preempted, that snapshot goes to the prefix cache under the hash of the prefix
it ends (the chained hash of its last block); a later request whose prefix
matches starts from a copy of it. Cached snapshots give up their slots, least
recently used first, when a request needs one.

The device work is a list of copies per step, which the model runner runs:
`restores` before the step's forward pass (a cached snapshot, or zeros, into a
new request's live slot) and `snapshots` after it (live slot into snapshot
slot).
"""

from collections import OrderedDict
from dataclasses import dataclass

from nanovllm.core.request import Request

RUNNING_SEQUENCE_SLOTS = 2  # the slots a running request holds: its live state and its snapshot
# the source of a restore that zeroes its slot: the request starts from the empty state
ZERO_STATE = -1


@dataclass
class _Snapshot:
    """A cached snapshot: its slot, and the tokens of the block it ends (a guard against hash collisions)."""

    slot: int
    last_block: list[int]


class StateSlots:
    """The pool of `num_slots` state slots: two per running request, the rest cached snapshots or free."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.free_slots: list[int] = list(range(num_slots - 1, -1, -1))
        self.cached: OrderedDict[int, _Snapshot] = OrderedDict()  # prefix hash -> snapshot, oldest use first
        self.restores: list[tuple[int, int]] = []  # (source slot or ZERO_STATE, live slot), before the forward
        self.snapshots: list[tuple[int, int]] = []  # (live slot, snapshot slot), after the forward

    def snapshot_at(self, prefix_hash: int, last_block: list[int]) -> int:
        """The slot of the cached snapshot of the prefix whose chained hash is `prefix_hash` and whose last
        block holds `last_block`, or ZERO_STATE."""
        snapshot = self.cached.get(prefix_hash)
        return snapshot.slot if snapshot is not None and snapshot.last_block == last_block else ZERO_STATE

    def can_admit(self, source: int) -> bool:
        """Whether two slots can be found for a new request, keeping the snapshot in `source` it starts from."""
        return len(self.free_slots) + len(self.cached) - (source != ZERO_STATE) >= RUNNING_SEQUENCE_SLOTS

    def admit(self, req: Request, source: int) -> None:
        """Give `req` its live and snapshot slots; its live state starts as a copy of `source` (a cached
        snapshot, which is used again and so moves to the back of the eviction queue) or zeros."""
        req.state_slot = self._take(keep=source)
        req.snapshot_slot = self._take(keep=source)
        req.snapshot_tokens = 0
        self.restores.append((source, req.state_slot))
        for prefix_hash, snapshot in self.cached.items():
            if snapshot.slot == source:
                self.cached.move_to_end(prefix_hash)
                break

    def snapshot(self, req: Request, num_tokens: int) -> None:
        """After the step now scheduled, `req`'s state is that of its first `num_tokens` tokens, a block
        boundary: copy it to the request's snapshot slot."""
        self.snapshots.append((req.state_slot, req.snapshot_slot))
        req.snapshot_tokens = num_tokens

    def release(self, req: Request, prefix_hash: int | None, last_block: list[int]) -> None:
        """Take `req`'s slots back: its live one is freed, its snapshot cached under `prefix_hash` (None: its
        snapshot is of no use, freed too)."""
        self.free_slots.append(req.state_slot)
        if prefix_hash is None or prefix_hash in self.cached:
            self.free_slots.append(req.snapshot_slot)
        else:
            self.cached[prefix_hash] = _Snapshot(req.snapshot_slot, last_block)
        req.state_slot = req.snapshot_slot = -1
        req.snapshot_tokens = 0

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The restores and snapshots of the step being scheduled, handed over once."""
        copies = (self.restores, self.snapshots)
        self.restores, self.snapshots = [], []
        return copies

    def _take(self, keep: int) -> int:
        if self.free_slots:
            return self.free_slots.pop()
        for prefix_hash, snapshot in self.cached.items():
            if snapshot.slot != keep:
                del self.cached[prefix_hash]
                return snapshot.slot
        raise AssertionError("no state slot to take: can_admit was not asked")
