"""Decode-step inputs packed in one buffer, so a step costs one host-to-device copy."""

from itertools import chain

import numpy as np
import torch

from nanovllm.sample.noise import draw_row_seeds

_FIELDS = 8  # input_ids, src_rows, positions, slot_mapping, context_lens, temperatures, seeds, seq_order
_TEMPERATURES = 5


class DecodeBuffers:
    """Two pinned host buffers, used in turn, and one device buffer holding a decode step's inputs.

    For a step padded to `size` rows the int64 layout is
    input_ids[size] | src_rows[size] | positions[size] | slot_mapping[size] | context_lens[size]
    | temperatures[size] | seeds[size] | seq_order[size] | block_tables[size, width],
    so the device views of a given size always sit at the same addresses: a CUDA
    graph captured on them replays on the next step's copy. `src_rows[i] >= 0`
    means row i's token is the previous step's sampled id of that row, still on
    the device (the input id there is a placeholder). The temperatures are
    float64 values in their int64 slots (the views reinterpret them), so that
    they travel in the same copy. Each row's sampling noise comes from its seed,
    drawn afresh every step by a generator seeded with `seed`, so that a
    replayed graph draws new noise without a kernel to make it. `seq_order`
    lists the rows by context length, longest first: decode attention starts
    its programs in that order, so that no long context is left running alone
    at the end of the kernel. Rows past the
    real sequences are padding: token 0 at position 0 (valid indices for the
    embedding and the rotary table), slot -1 (store nothing), context length 0
    (read nothing), temperature 0 (greedy).

    The host buffers alternate so that writing step n+1's inputs never touches
    the memory whose copy to the device step n may still have queued.
    """

    def __init__(self, max_rows: int, width: int, block_size: int, device: torch.device, seed: int = 0):
        self.width = width
        self.block_size = block_size
        capacity = max_rows * (_FIELDS + width)
        pin = device.type == "cuda"
        self.hosts = [torch.zeros(capacity, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.device = torch.zeros(capacity, dtype=torch.int64, device=device)
        # the same memory as numpy arrays: their slices cost far less than tensor views
        self._host_arrays = [host.numpy() for host in self.hosts]
        self._turn = 0
        self._rng = np.random.default_rng(seed)
        self._device_views: dict[int, tuple[torch.Tensor, ...]] = {}

    def _split(self, buffer, size: int, float64) -> tuple:
        flat = buffer[: size * _FIELDS].reshape(_FIELDS, size)
        tables = buffer[size * _FIELDS : size * (_FIELDS + self.width)].reshape(size, self.width)
        fields = list(flat)
        fields[_TEMPERATURES] = fields[_TEMPERATURES].view(float64)
        return (*fields, tables)

    def views(self, size: int) -> tuple[torch.Tensor, ...]:
        """Device (input_ids, src_rows, positions, slot_mapping, context_lens, temperatures, seeds,
        seq_order, block_tables) of `size` rows."""
        if size not in self._device_views:
            self._device_views[size] = self._split(self.device, size, torch.float64)
        return self._device_views[size]

    def load(
        self,
        input_ids: list[int],
        src_rows: list[int],
        positions: list[int],
        temperatures: list[float],
        block_tables: list[list[int]],
        size: int,
    ) -> tuple[torch.Tensor, ...]:
        """Write one step's rows, padded to `size`, and queue their copy to the device; returns device views.

        Per row: its input token (any value where `src_rows` >= 0), the row of the
        previous step's samples that holds it (-1: none), its position (the
        context length less one), the temperature its next token is drawn at and
        its block table.
        """
        host = self._host_arrays[self._turn]
        n, bs = len(input_ids), self.block_size
        ids, src, pos, slots, lens, temps, seeds, order, tables = self._split(host, size, np.float64)
        ids[:n] = input_ids
        src[:n] = src_rows
        pos[:n] = positions
        lens[:n] = pos[:n] + 1
        temps[:n] = temperatures
        # this region held other fields for other sizes: a stale slot or -1 is no token id or position
        ids[n:] = 0
        src[n:] = -1
        pos[n:] = 0
        lens[n:] = 0
        temps[n:] = 0.0
        seeds[:] = draw_row_seeds(self._rng, size)
        order[:] = np.argsort(-lens, kind="stable")
        tables.fill(-1)  # the pad the Context promises
        # every block table in one pass: row i takes widths[i] entries of the concatenation
        widths = np.fromiter((len(table) for table in block_tables), np.int64, n)
        in_table = np.arange(self.width) < widths[:, None]
        tables[:n][in_table] = np.fromiter(chain.from_iterable(block_tables), np.int64, int(widths.sum()))
        slots[:n] = tables[np.arange(n), pos[:n] // bs] * bs + pos[:n] % bs
        slots[n:] = -1
        used = size * (_FIELDS + self.width)
        self.device[:used].copy_(self.hosts[self._turn][:used], non_blocking=True)
        self._turn ^= 1
        return self.views(size)
