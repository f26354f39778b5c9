"""CUDA graphs of the decode forward pass, one per batch size, replayed with padded slots."""

import torch
from torch import nn

from nanovllm.utils.context import Context, reset_context, set_context


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to min(max_num_seqs, 512), which is always included."""
    largest = min(max_num_seqs, 512)
    sizes = [s for s in [1, 2, 4, 8, *range(16, largest + 1, 16)] if s <= largest]
    return sizes if sizes[-1] == largest else sizes + [largest]


class DecodeGraphs:
    """Decode steps of up to the largest captured size replay a graph; the inputs live in static buffers.

    A batch replays the smallest graph that fits; its unused slots get slot -1
    (nothing stored) and context length 0 (nothing read).
    """

    def __init__(self, model: nn.Module, max_num_seqs: int, max_blocks_per_seq: int, hidden_size: int,
                 dtype: torch.dtype, device: torch.device):
        self.model = model
        self.sizes = capture_sizes(max_num_seqs)
        largest = self.sizes[-1]
        ints = dict(dtype=torch.int32, device=device)
        longs = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(largest, **longs)
        self.positions = torch.zeros(largest, **longs)
        self.slot_mapping = torch.full((largest,), -1, **longs)
        self.context_lens = torch.zeros(largest, **ints)
        self.block_tables = torch.zeros(largest, max_blocks_per_seq, **ints)
        self.outputs = torch.zeros(largest, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture_all()

    def _context(self, size: int) -> Context:
        return Context(is_prefill=False, slot_mapping=self.slot_mapping[:size], context_lens=self.context_lens[:size],
                       block_tables=self.block_tables[:size])

    def _capture_all(self) -> None:
        pool = None
        for size in reversed(self.sizes):  # largest first, so smaller graphs fit in its pool
            graph = torch.cuda.CUDAGraph()
            set_context(self._context(size))
            self.outputs[:size] = self.model(self.input_ids[:size], self.positions[:size])  # compiles kernels
            with torch.cuda.graph(graph, pool):
                self.outputs[:size] = self.model(self.input_ids[:size], self.positions[:size])
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
            torch.cuda.synchronize()
        reset_context()

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, context: Context) -> torch.Tensor:
        """Hidden states [seqs, hidden] of one decode step, by replaying the smallest graph that fits."""
        n = input_ids.size(0)
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n] = input_ids
        self.positions[:n] = positions
        self.slot_mapping[:n] = context.slot_mapping
        self.slot_mapping[n:size] = -1
        self.context_lens[:n] = context.context_lens
        self.context_lens[n:size] = 0
        self.block_tables[:n, :context.block_tables.size(1)] = context.block_tables
        self.graphs[size].replay()
        return self.outputs[:n]
