"""Decode-step inputs packed in one buffer, so a step costs one host-to-device copy."""

from itertools import chain

import numpy as np
import torch

from nanovllm.engine.sequence import Sequence


class DecodeBuffers:
    """A pinned host buffer and its device twin holding one decode step's inputs.

    For a step padded to `size` rows the int64 layout is
    input_ids[size] | positions[size] | slot_mapping[size] | context_lens[size] | block_tables[size, width],
    so the device views of a given size always sit at the same addresses: a CUDA
    graph captured on them replays on the next step's copy. Rows past the real
    sequences are padding: token 0 at position 0 (valid indices for the embedding
    and the rotary table), slot -1 (store nothing), context length 0 (read nothing).
    """

    def __init__(self, max_rows: int, width: int, block_size: int, device: torch.device):
        self.width = width
        self.block_size = block_size
        capacity = max_rows * (4 + width)
        self.host = torch.zeros(capacity, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.device = torch.zeros(capacity, dtype=torch.int64, device=device)
        self._host_array = self.host.numpy()  # the same memory; numpy slices cost far less than tensor views
        self._device_views: dict[int, tuple[torch.Tensor, ...]] = {}

    def _split(self, buffer, size: int) -> tuple:
        flat = buffer[: size * 4].reshape(4, size)
        tables = buffer[size * 4: size * (4 + self.width)].reshape(size, self.width)
        return flat[0], flat[1], flat[2], flat[3], tables

    def views(self, size: int) -> tuple[torch.Tensor, ...]:
        """Device (input_ids, positions, slot_mapping, context_lens, block_tables) of `size` rows."""
        if size not in self._device_views:
            self._device_views[size] = self._split(self.device, size)
        return self._device_views[size]

    def load(self, seqs: list[Sequence], size: int) -> tuple[torch.Tensor, ...]:
        """Write the inputs of `seqs`, padded to `size` rows, and copy them to the device; returns device views."""
        n, bs = len(seqs), self.block_size
        ids, positions, slots, lens, tables = self._split(self._host_array, size)
        ids[:n] = [seq.last_token for seq in seqs]
        lens[:n] = [seq.num_tokens for seq in seqs]
        positions[:n] = lens[:n] - 1
        # this region held other fields for other sizes: a stale slot or -1 is no token id or position
        ids[n:] = 0
        positions[n:] = 0
        lens[n:] = 0
        tables.fill(-1)  # the pad the Context promises
        # every block table in one pass: row i takes widths[i] entries of the concatenation
        widths = np.fromiter((len(seq.block_table) for seq in seqs), np.int64, n)
        in_table = np.arange(self.width) < widths[:, None]
        tables[:n][in_table] = np.fromiter(chain.from_iterable(seq.block_table for seq in seqs), np.int64,
                                           int(widths.sum()))
        slots[:n] = tables[np.arange(n), positions[:n] // bs] * bs + positions[:n] % bs
        slots[n:] = -1
        used = size * (4 + self.width)
        self.device[:used].copy_(self.host[:used], non_blocking=True)
        return self.views(size)
