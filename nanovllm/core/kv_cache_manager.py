"""Paged KV-cache bookkeeping: one pool of blocks for every cache group, with a hash-chained prefix cache."""

from array import array
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

import numpy as np
import xxhash

from nanovllm.cache.layout import CacheGroup, CacheLayout
from nanovllm.core.request import Request
from nanovllm.core.state_slots import ZERO_STATE, StateSlots

# a block table's entry for a block the request gave back (behind a sliding window)
NO_BLOCK = -1


def given_back_run_end(table: list[int], start: int, stop: int) -> int:
    """Where the leading run of given-back (NO_BLOCK) entries of `table` ends, searched within [start, stop)
    (a sliding group gives back a table's blocks from its front, so those entries lead it)."""
    return bisect_left(table, True, start, stop, key=lambda block: block != NO_BLOCK)


class Block:
    """One block of the pool: `ref_count` requests hold it; `key` (cache group, prefix hash) names its
    content once it is full and registered (None before), and `token_ids` guard against hash collisions."""

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.key: tuple[int, int] | None = None
        self.token_ids: list[int] = []

    def reset(self) -> None:
        self.ref_count = 1
        self.key = None
        self.token_ids = []


def chain_hash(token_ids: list[int], prefix_hash: int = -1) -> int:
    """xxhash64 of the previous block's hash and this block's tokens: names the whole prefix."""
    h = xxhash.xxh64()
    if prefix_hash != -1:
        h.update(prefix_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


@dataclass
class PrefixHit:
    """The leading tokens of a request that the cache holds (`num_tokens`, whole blocks), per cache
    group the block table that reads them (NO_BLOCK behind a sliding group's window), and on a model with
    recurrent layers the slot of the state snapshot taken after them (ZERO_STATE: none, no tokens)."""

    num_tokens: int
    tables: list[list[int]]
    state_source: int = ZERO_STATE
    # with recurrent layers, where the blocks every full-attention group holds end, past the snapshot's tokens
    # (0: they end there): the state there is cached for the requests that share this prefix
    branch_tokens: int = 0


class KVCacheManager:
    """Owns the pool of KV blocks that every cache group (`CacheLayout.groups`) takes from: hands them out,
    shares cached prefixes, gives them back.

    A request holds one block table per group (`Request.block_tables`). A
    full-attention group holds a block for every token from admission on; a
    sliding-window group only the blocks of the window that the request's next
    step reads (`CacheGroup.first_kept_position`, `lookback` tokens wider for
    steps that move back over rejected drafts), taken as the step reaches them
    and given back as the window leaves them. Free blocks wait in a FIFO and
    keep their content, so a later request with the same prefix can revive them;
    a block is reused for new content only once it reaches the head of the
    queue. A prefix hit needs, in every group, the blocks its first computed
    token reads: all of them for full attention, the window's for a sliding
    group. With `enable_prefix_caching=False` nothing is looked up or registered.

    On a model with recurrent layers the manager also keeps the `num_state_slots`
    state slots (`StateSlots`): a request takes two on admission and gives them
    back when it ends or is preempted, its snapshot then cached. A prefix hit
    there also needs a snapshot of the state after its last block, so it ends
    where an earlier request's snapshot does; a step that ends on a block
    boundary snapshots the state.

    With `lookahead` > 0 a request holds, in each full-attention group, blocks
    for that many positions past the end of its step too: speculative method
    "mtp" writes its further drafts' K/V there (`worker/mtp_drafter.py`), which
    the request's next step computes again.
    """

    def __init__(
        self,
        layout: CacheLayout,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        lookback: int = 0,
        num_state_slots: int = 0,
        lookahead: int = 0,
    ):
        self.groups: tuple[CacheGroup, ...] = layout.groups
        self._windows = [group.window for group in layout.groups]  # read at every step of every request
        # per window, how many groups have it and the most blocks a request holds in one of them (None: every
        # block, full attention)
        self._group_kinds = [
            (self._windows.count(window), None if window is None else group.window_blocks(block_size, lookback))
            for window, group in {group.window: group for group in layout.groups}.items()
        ]
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.lookback = lookback
        self.lookahead = lookahead
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.cached_blocks: dict[tuple[int, int], int] = {}  # (group, prefix hash) -> block id
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.states = StateSlots(num_state_slots) if layout.has_state else None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def usage(self) -> float:
        """The share of the pool that requests hold."""
        return 1.0 - self.num_free_blocks / len(self.blocks)

    def no_hit(self) -> PrefixHit:
        """A hit of nothing: every token is computed."""
        return PrefixHit(0, [[] for _ in self.groups])

    def cached_prefix(self, req: Request) -> PrefixHit:
        """The longest run of `req`'s leading full blocks that every group can read from the cache.

        At least one token is always left to compute, so that the step has a
        last position to sample from and never writes into a shared block.
        """
        if not self.enable_prefix_caching:
            return self.no_hit()
        bs = self.block_size
        num_blocks = min(req.num_tokens - 1, len(req.token_ids)) // bs
        lookup = _Lookup(self, req, self._block_hashes(req, num_blocks))
        for g, group in enumerate(self.groups):
            if group.window is None:
                num_blocks = next((i for i in range(num_blocks) if lookup(g, i) == NO_BLOCK), num_blocks)
        held = num_blocks
        num_blocks = self._fit_windows_and_snapshots(lookup, num_blocks)
        tables = []
        for g, group in enumerate(self.groups):
            first = group.first_kept_position(num_blocks * bs, 0) // bs
            tables.append([NO_BLOCK] * first + [lookup(g, i) for i in range(first, num_blocks)])
        branch = held * bs if self.states is not None and held > num_blocks else 0
        return PrefixHit(num_blocks * bs, tables, lookup.snapshot(num_blocks), branch)

    def _fit_windows_and_snapshots(self, lookup: "_Lookup", num_blocks: int) -> int:
        """The most leading blocks, at most `num_blocks`, after which every sliding group holds the blocks
        its window reads (each missing one moves the end back to it) and, with recurrent layers, a snapshot
        of the state was cached (the end moves back to the last one)."""
        moved = True
        while moved and num_blocks:
            moved = False
            for g, group in enumerate(self.groups):
                first = group.first_kept_position(num_blocks * self.block_size, 0) // self.block_size
                missing = next((i for i in reversed(range(first, num_blocks)) if lookup(g, i) == NO_BLOCK), None)
                if missing is not None:
                    num_blocks, moved = missing, True
            if self.states is not None and lookup.snapshot(num_blocks) == ZERO_STATE:
                num_blocks = next((i for i in range(num_blocks - 1, 0, -1) if lookup.snapshot(i) != ZERO_STATE), 0)
                moved = True
        return num_blocks

    def state_on_its_way(self, req: Request, hit: PrefixHit) -> bool:
        """Whether the step being scheduled caches the state where `req`'s shared blocks end (another request
        that shares them computes it): admitted one step later, `req` starts from it."""
        if not hit.branch_tokens:
            return False
        return self.states.is_fresh(*self._prefix_key(req, hit.branch_tokens // self.block_size))

    def can_allocate(self, req: Request, hit: PrefixHit, end: int) -> bool:
        """Whether the free list covers `req`'s blocks on admission, given its prefix hit, when its first
        step computes its tokens up to `end`."""
        revived = sum(1 for table in hit.tables for b in table if b != NO_BLOCK and self.blocks[b].ref_count == 0)
        lengths = self._table_lengths(req, end)
        new = sum(max(0, length - len(table)) for length, table in zip(lengths, hit.tables))
        if self.states is not None and not self.states.can_admit(hit.state_source):
            return False
        return revived + new <= self.num_free_blocks

    def peak_blocks(self, plans: list[tuple[int, int, int]]) -> int:
        """A bound on the most blocks that requests hold at once as they decode on, each given as (tokens
        now, tokens at its end, steps until its end) and taking at most a token per step until then.

        The requests hold the most just before one of them ends: then each that
        ends no sooner holds at most its tokens now plus the steps gone, and in a
        sliding group at most what its window spans.
        """
        now, end, steps = np.array(plans, dtype=np.int64).reshape(-1, 3).T  # [requests] each
        bs = self.block_size
        order = np.argsort(-steps, kind="stable")
        running = np.arange(1, len(order) + 1)  # [requests]: those still running just before each one ends
        held = np.cumsum(now[order])
        # sum(ceil(tokens_i / bs)) <= (sum(tokens_i) + running * (bs - 1)) // bs
        full = (held + running * (steps[order] + bs - 1)) // bs  # [requests]
        return sum(
            count * int((full if most is None else np.minimum(full, running * most)).max(initial=0))
            for count, most in self._group_kinds
        )

    def allocate(self, req: Request, hit: PrefixHit, end: int) -> None:
        """Give `req` its block tables: the hit's blocks shared, the rest fresh, for its first step, which
        computes its tokens up to `end`; the full blocks among them are registered in the prefix cache (and
        no others, so that a later request never shares a block whose K/V is not computed yet)."""
        assert not req.block_tables
        for table in hit.tables:
            for block_id in table:
                if block_id != NO_BLOCK:
                    self._hold(block_id)
        req.block_tables = [list(table) for table in hit.tables]
        req.num_cached_tokens = req.num_computed_tokens = hit.num_tokens
        req.branch_tokens = hit.branch_tokens
        if self.states is not None:
            self.states.admit(req, hit.state_source, with_snapshot=self.enable_prefix_caching)
        self.may_append(req, end)

    def deallocate(self, req: Request) -> None:
        """Drop `req`'s references, each table's last block first; freed blocks keep their content. Its
        state slots go back, its snapshot to the prefix cache."""
        for table in req.block_tables:
            for block_id in reversed(table):
                if block_id != NO_BLOCK:
                    self._release(block_id)
        req.block_tables = []
        req.num_computed_tokens = 0
        if self.states is not None:
            self._release_state(req)

    def _release_state(self, req: Request) -> None:
        """Give `req`'s state slots back, caching its snapshot where its tokens are all confirmed (a snapshot
        taken by a step still in flight past a placeholder is dropped)."""
        num_blocks = req.snapshot_tokens // self.block_size
        if not (self.enable_prefix_caching and num_blocks and req.snapshot_tokens <= len(req.token_ids)):
            self.states.release(req, None, [])
            return
        self.states.release(req, *self._prefix_key(req, num_blocks))

    def blocks_needed(self, req: Request, end: int, num_tokens: int | None = None) -> int:
        """Free blocks `req` takes if its next step computes its tokens up to `end` and it then has
        `num_tokens` tokens (default: as now), less those its windows give back then."""
        needed, blocks = 0, self.blocks
        for group, window, table, length in zip(
            self.groups, self._windows, req.block_tables, self._table_lengths(req, end, num_tokens)
        ):
            needed += max(0, length - len(table))
            if window is not None:
                needed -= sum(1 for i in self._behind_window(group, req, table) if blocks[table[i]].ref_count == 1)
        return needed

    def can_append(self, req: Request, end: int) -> bool:
        """Whether the free list covers what `req`'s next step needs, which computes its tokens up to `end`."""
        return self.blocks_needed(req, end) <= self.num_free_blocks

    def may_append(self, req: Request, end: int) -> None:
        """Prepare `req`'s tables for a step that computes its tokens from `num_computed_tokens` up to `end`:
        a sliding group gives back the blocks behind its window, each group takes the blocks the step writes
        (a full group every block of the request's tokens), and the blocks full once the step ran are
        registered.

        Only confirmed tokens count: a block holding a placeholder is registered
        by a later step, once its value is known.
        """
        num_full = min(end, len(req.token_ids)) // self.block_size
        blocks = self.blocks
        lengths = self._table_lengths(req, end)
        for g, (group, window, table, length) in enumerate(zip(self.groups, self._windows, req.block_tables, lengths)):
            if window is not None:
                for i in self._behind_window(group, req, table):
                    self._release(table[i])
                    table[i] = NO_BLOCK
            for _ in range(length - len(table)):
                table.append(self._take_free_block())
            # most steps fill no block: then the last full one is registered already
            last = table[num_full - 1] if num_full else NO_BLOCK
            if self.enable_prefix_caching and last != NO_BLOCK and blocks[last].key is None:
                self._register_full_blocks(g, req, num_full)
        if self.states is not None and self._snapshot_due(req, end):
            self.states.snapshot(req, end)
            if end in (req.branch_tokens, req.num_prompt_tokens // self.block_size * self.block_size):
                self.states.cache_now(req, *self._prefix_key(req, end // self.block_size))

    def _snapshot_due(self, req: Request, end: int) -> bool:
        """Whether the step computing `req`'s tokens up to `end` leaves its state at a block boundary that its
        snapshot is not at yet. A step with drafts, which may be rejected, takes none; nor does one scheduled
        past drafts still in flight (more unknown tokens than the one sampled last), whose end moves back by
        the drafts rejected there."""
        return (
            self.enable_prefix_caching
            and end % self.block_size == 0
            and end > req.snapshot_tokens
            and not req.draft_token_ids
            and req.num_placeholders <= 1
        )

    def chunk_end(self, start: int, end: int, branch_tokens: int = 0) -> int:
        """Where a chunk that would compute a request's tokens from `start` up to `end` stops: with recurrent
        layers, at `branch_tokens` (`PrefixHit.branch_tokens`) where it crosses that, else at the last block
        boundary it crosses, so that the state there can be snapshotted (the rest follows in the next step);
        elsewhere `end`."""
        boundary = end // self.block_size * self.block_size
        if self.states is None or not self.enable_prefix_caching or boundary <= start:
            return end
        return branch_tokens if start < branch_tokens < boundary else boundary

    def take_state_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The state copies of the step being scheduled: (restores before its forward, snapshots after it)."""
        return self.states.take_copies() if self.states is not None else ([], [])

    def _table_lengths(self, req: Request, end: int, num_tokens: int | None = None) -> list[int]:
        """Per group, the blocks its table spans once a step computes `req`'s tokens up to `end`: those of
        every token (`num_tokens`, default the request's) for full attention, up to `end` for a sliding window."""
        bs = self.block_size
        every = (max(end + self.lookahead, req.num_tokens if num_tokens is None else num_tokens) + bs - 1) // bs
        written = (end + bs - 1) // bs
        return [every if window is None else written for window in self._windows]

    def _behind_window(self, group: CacheGroup, req: Request, table: list[int]) -> range:
        """Indices of the blocks `req` still holds in sliding `group` that its next step's window (`lookback`
        positions wider) has left: those after the leading run it gave back already."""
        first = group.first_kept_position(req.num_computed_tokens, self.lookback) // self.block_size
        stop = min(first, len(table))
        return range(given_back_run_end(table, 0, stop), stop)

    def _block_hashes(self, req: Request, num_blocks: int) -> list[int]:
        """`req`'s chained block hashes, those of its first `num_blocks` blocks (full, confirmed) computed by
        now, each once; the list may hold more."""
        hashes = req.block_hashes
        for i in range(len(hashes), num_blocks):
            hashes.append(chain_hash(req.block(i), hashes[-1] if hashes else -1))
        return hashes

    def _prefix_key(self, req: Request, num_blocks: int) -> tuple[int, list[int]]:
        """What a state snapshot after `req`'s first `num_blocks` (> 0) full blocks is cached under: their
        chained hash, and the tokens of the last (a guard against hash collisions)."""
        return self._block_hashes(req, num_blocks)[num_blocks - 1], req.block(num_blocks - 1)

    def _register_full_blocks(self, group: int, req: Request, num_full: int) -> None:
        # Walk back to the last block that is registered (or given back), then register forward.
        table = req.block_tables[group]
        first = num_full
        while first > 0 and table[first - 1] != NO_BLOCK and self.blocks[table[first - 1]].key is None:
            first -= 1
        if first == num_full:
            return
        hashes = self._block_hashes(req, num_full)
        for i in range(first, num_full):
            block = self.blocks[table[i]]
            block.key = (group, hashes[i])
            block.token_ids = req.block(i)
            self.cached_blocks[block.key] = block.block_id

    def _hold(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self.free_block_ids.remove(block_id)
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_block_ids.append(block_id)

    def _take_free_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.key is not None and self.cached_blocks.get(block.key) == block_id:
            del self.cached_blocks[block.key]
        block.reset()
        return block_id


class _Lookup:
    """One request's blocks in the prefix cache, looked up once each: `lookup(group, i)` is the cached block
    of the request's block i in that group, or NO_BLOCK (also where a hash collides); `snapshot(n)` the slot
    of the cached state after its first n blocks, or ZERO_STATE."""

    def __init__(self, manager: KVCacheManager, req: Request, hashes: list[int]):
        self.manager, self.req, self.hashes = manager, req, hashes
        self.found: dict[tuple[int, int], int] = {}

    def __call__(self, group: int, i: int) -> int:
        if (group, i) not in self.found:
            block_id = self.manager.cached_blocks.get((group, self.hashes[i]), NO_BLOCK)
            if block_id != NO_BLOCK and self.manager.blocks[block_id].token_ids != self.req.block(i):
                block_id = NO_BLOCK
            self.found[group, i] = block_id
        return self.found[group, i]

    def snapshot(self, num_blocks: int) -> int:
        states = self.manager.states
        if states is None or num_blocks == 0:
            return ZERO_STATE
        return states.snapshot_at(self.hashes[num_blocks - 1], self.req.block(num_blocks - 1))
