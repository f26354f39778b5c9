"""Decode-step inputs packed in one buffer, so a step costs one host-to-device copy."""

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

    def views(self, size: int, buffer: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """(input_ids, positions, slot_mapping, context_lens, block_tables) for `size` rows of `buffer`."""
        buffer = self.device if buffer is None else buffer
        flat = buffer[: size * 4].view(4, size)
        tables = buffer[size * 4: size * (4 + self.width)].view(size, self.width)
        return flat[0], flat[1], flat[2], flat[3], tables

    def load(self, seqs: list[Sequence], size: int) -> tuple[torch.Tensor, ...]:
        """Write the inputs of `seqs`, padded to `size` rows, and copy them to the device; returns device views."""
        n, bs = len(seqs), self.block_size
        ids, positions, slots, lens, tables = (v.numpy() for v in self.views(size, self.host))
        lens[:n] = [seq.num_tokens for seq in seqs]
        positions[:n] = lens[:n] - 1
        ids[:n] = [seq.last_token for seq in seqs]
        last_blocks = np.array([seq.block_table[(seq.num_tokens - 1) // bs] for seq in seqs], dtype=np.int64)
        slots[:n] = last_blocks * bs + positions[:n] % bs
        # this region held other fields for other sizes: a stale slot or -1 is no token id or position
        ids[n:] = 0
        positions[n:] = 0
        slots[n:] = -1
        lens[n:] = 0
        tables.fill(-1)  # the pad the Context promises
        for row, seq in zip(tables, seqs):
            row[:len(seq.block_table)] = seq.block_table
        used = size * (4 + self.width)
        self.device[:used].copy_(self.host[:used], non_blocking=True)
        return self.views(size)
