"""Decode-step inputs packed in one buffer, so a step costs one host-to-device copy."""

from itertools import chain

import numpy as np
import torch

from nanovllm.sample.noise import draw_row_seeds

# per query: input_ids, src_rows, positions, then a slot_mapping row per cache group, then context_lens,
# temperatures, seeds
_FIELDS_BESIDE_SLOTS = 6
_SLOTS = 3  # the first slot_mapping row


class DecodeBuffers:
    """Two pinned host buffers, used in turn, and one device buffer holding a decode step's inputs.

    A step has `size` sequences (padded to a graph size) of `queries` query
    tokens each: one in a plain decode step; in a verify step (speculative
    decoding) the last token, then its drafts, then copies of the last real
    query up to `queries` (padding within a sequence: same position, so the
    same keys, and nothing stored). With rows = size * queries, a sequence's
    queries one after another, and G cache groups (`CacheLayout.groups`), the
    int64 layout is
    input_ids[rows] | src_rows[rows] | positions[rows] | slot_mapping[G, rows] | context_lens[rows]
    | temperatures[rows] | seeds[rows] | seq_order[size] | state_slots[size] | block_tables[G, size, width]
    (state_slots only on a model with recurrent layers: `scratch_state_slot` set), so the device views of
    a given shape always sit at the same addresses: a CUDA graph captured on them replays on the next
    step's copy. Group g's slots are
    computed from its own block table, whose entries for blocks behind a sliding
    window are -1 (never a block a query stores to or reads). `src_rows[i] >= 0`
    means query i's token is the previous step's sampled id of that row, still
    on the device (the input id there is a placeholder). `context_lens` are per
    query: its position + 1, the keys it sees. The temperatures are float64
    values in their int64 slots (the views reinterpret them), so that they
    travel in the same copy. Each query's sampling noise comes from its seed,
    drawn afresh every step by a generator seeded with `seed`, so that a
    replayed graph draws new noise without a kernel to make it. `seq_order`
    lists the sequences by context length, longest first: decode attention
    starts its programs in that order, so that no long context is left running
    alone at the end of the kernel. `state_slots` holds each sequence's
    recurrent-state slot. Sequences past the real ones are padding:
    token 0 at position 0 (valid indices for the embedding and the rotary
    table), slot -1 (store nothing), context length 0 (read nothing),
    temperature 0 (greedy), the scratch state slot (whose state nothing reads back).

    The host buffers alternate so that writing step n+1's inputs never touches
    the memory whose copy to the device step n may still have queued.
    """

    def __init__(
        self,
        max_seqs: int,
        width: int,
        block_size: int,
        device: torch.device,
        seed: int = 0,
        max_queries: int = 1,
        num_groups: int = 1,
        scratch_state_slot: int | None = None,
    ):
        self.width = width
        self.block_size = block_size
        self.num_groups = num_groups
        self.scratch_state_slot = scratch_state_slot  # None: the model keeps no recurrent state
        self._seq_fields = 1 + (scratch_state_slot is not None)  # seq_order, and state_slots with state
        self._token_fields = _FIELDS_BESIDE_SLOTS + num_groups
        capacity = self._used(max_seqs, max_queries)
        pin = device.type == "cuda"
        self.hosts = [torch.zeros(capacity, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.device = torch.zeros(capacity, dtype=torch.int64, device=device)
        # the same memory as numpy arrays: their slices cost far less than tensor views
        self._host_arrays = [host.numpy() for host in self.hosts]
        self._turn = 0
        self._rng = np.random.default_rng(seed)
        self._device_views: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        # per host buffer, its numpy views of each shape, the per-query fields as [size, queries]
        self._host_views: list[dict[tuple[int, int], tuple[np.ndarray, ...]]] = [{}, {}]

    def _split(self, buffer, size: int, queries: int, float64) -> tuple:
        rows, groups, fields = size * queries, self.num_groups, self._token_fields
        per_query = buffer[: rows * fields].reshape(fields, rows)
        ids, src, pos = per_query[:_SLOTS]
        slots = per_query[_SLOTS : _SLOTS + groups]  # [groups, rows]
        lens, temps, seeds = per_query[_SLOTS + groups :]
        per_seq = buffer[rows * fields : rows * fields + size * self._seq_fields].reshape(self._seq_fields, size)
        order = per_seq[0]
        states = per_seq[1] if self.scratch_state_slot is not None else None
        tables = buffer[rows * fields + size * self._seq_fields : self._used(size, queries)]
        tables = tables.reshape(groups, size, self.width)
        return ids, src, pos, slots, lens, temps.view(float64), seeds, order, tables, states

    def _used(self, size: int, queries: int) -> int:
        return size * (queries * self._token_fields + self._seq_fields + self.num_groups * self.width)

    def _host_views_of(self, size: int, queries: int) -> tuple[np.ndarray, ...]:
        """The current host buffer's views of that shape, the per-query fields (but the seeds) as
        [size, queries] (the slots [groups, size, queries]); made once per shape."""
        views = self._host_views[self._turn]
        if (size, queries) not in views:
            ids, src, pos, slots, lens, temps, seeds, order, tables, states = self._split(
                self._host_arrays[self._turn], size, queries, np.float64
            )
            ids, src, pos, lens, temps = (x.reshape(size, queries) for x in (ids, src, pos, lens, temps))
            slots = slots.reshape(self.num_groups, size, queries)
            views[size, queries] = (ids, src, pos, slots, lens, temps, seeds, order, tables, states)
        return views[size, queries]

    def views(self, size: int, queries: int = 1) -> tuple[torch.Tensor | None, ...]:
        """Device (input_ids, src_rows, positions, slot_mapping, context_lens, temperatures, seeds,
        seq_order, block_tables, state_slots) of `size` sequences of `queries` queries: [size * queries]
        each, but slot_mapping [groups, size * queries], seq_order [size], block_tables [groups, size,
        width] and state_slots [size] (None on a model without recurrent state)."""
        if (size, queries) not in self._device_views:
            self._device_views[size, queries] = self._split(self.device, size, queries, torch.float64)
        return self._device_views[size, queries]

    def load(
        self,
        input_ids: list[int],
        src_rows: list[int],
        positions: list[int],
        temperatures: list[float],
        block_tables: list[list[list[int]]],
        size: int,
        drafts: list[list[int]] | None = None,
        queries: int = 1,
        state_slots: list[int] | None = None,
    ) -> tuple[torch.Tensor | None, ...]:
        """Write one step's sequences, padded to `size` of `queries` queries each, and queue their copy to
        the device; returns device views.

        Per sequence: its last token (any value where `src_rows` >= 0), the row of
        the previous step's samples that holds it (-1: none), its position (the
        context length less one), the temperature its tokens are drawn at, its
        block table of each cache group, with `drafts` the tokens that
        follow it in this step (at most queries - 1), and on a model with
        recurrent state its `state_slots` entry.
        """
        n, q, bs = len(input_ids), queries, self.block_size
        ids, src, pos, slots, lens, temps, seeds, order, tables, states = self._host_views_of(size, q)
        ids[:n, 0] = input_ids
        src[:n, 0] = src_rows
        pos[:n, 0] = positions
        if drafts is not None:
            num_drafts = _lay_out_drafts(drafts, ids[:n], src[:n], pos[:n])
        lens[:n] = pos[:n] + 1
        temps[:n] = np.asarray(temperatures, np.float64)[:, None]
        # this region held other fields for other shapes: a stale slot or -1 is no token id or position
        ids[n:] = 0
        src[n:] = -1
        pos[n:] = 0
        lens[n:] = 0
        temps[n:] = 0.0
        seeds[:] = draw_row_seeds(self._rng, size * q)
        order[:] = np.argsort(-lens[:, -1], kind="stable")
        if states is not None:
            states[:n] = state_slots
            states[n:] = self.scratch_state_slot
        tables.fill(-1)  # the pad the Context promises
        # every block table in one pass: group-major, table (g, i) takes widths[g, i] entries of the concatenation
        by_group = list(chain.from_iterable(zip(*block_tables)))
        widths = np.fromiter(map(len, by_group), np.int64, len(by_group)).reshape(self.num_groups, n, 1)
        in_table = np.arange(self.width) < widths  # [groups, n, width]
        tables[:, :n][in_table] = np.fromiter(chain.from_iterable(by_group), np.int64, int(widths.sum()))
        slots[:, :n] = tables[:, np.arange(n)[:, None], pos[:n] // bs] * bs + pos[:n] % bs
        if drafts is not None:
            slots[:, :n][:, np.arange(q) > num_drafts[:, None]] = -1  # a padding query stores nothing
        slots[:, n:] = -1
        used = self._used(size, q)
        self.device[:used].copy_(self.hosts[self._turn][:used], non_blocking=True)
        self._turn ^= 1
        return self.views(size, q)


def _lay_out_drafts(drafts: list[list[int]], ids: np.ndarray, src: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Fill the queries after each sequence's last token ([sequences, queries] views whose first column is
    filled): its drafts, then padding that repeats the last real query's position. Returns the draft counts."""
    num_drafts = np.fromiter(map(len, drafts), np.int64, len(drafts))
    later = np.arange(1, ids.shape[1])
    ids[:, 1:] = 0
    ids[:, 1:][later <= num_drafts[:, None]] = np.fromiter(chain.from_iterable(drafts), np.int64, num_drafts.sum())
    src[:, 1:] = -1
    pos[:, 1:] = pos[:, :1] + np.minimum(later, num_drafts[:, None])
    return num_drafts
