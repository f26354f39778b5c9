"""CUDA graphs of the decode step, one per batch size (and per query count), replayed with padded slots."""

from collections.abc import Callable

import torch

from nanovllm.worker.decode_buffers import DecodeBuffers

# the most queries (sequences x (drafts + 1)) a captured verify step runs: their logits share one buffer with
# the decode graphs', [rows, vocab], taken from the KV cache's memory (2048 rows of Qwen3's vocabulary: 0.6 GB)
MAX_VERIFY_GRAPH_ROWS = 2048
# the decode buffers' views of one shape (`DecodeBuffers.views`) -> the step's output (logits, or hidden
# states with several ranks): the runner's DecodeStep
DecodeFunction = Callable[..., torch.Tensor]


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to min(max_num_seqs, 512), which is always included."""
    largest = min(max_num_seqs, 512)
    sizes = [s for s in [1, 2, 4, 8, *range(16, largest + 1, 16)] if s <= largest]
    return sizes if sizes[-1] == largest else sizes + [largest]


def verify_capture_sizes(max_num_seqs: int, queries: int, max_rows: int) -> list[int]:
    """The decode sizes whose verify steps of `queries` queries per sequence hold at most `max_rows` queries."""
    return [s for s in capture_sizes(max_num_seqs) if s * queries <= max_rows]


def max_graph_rows(max_num_seqs: int, verify_queries: int | None) -> int:
    """The most rows a captured step has: the largest decode batch, or the queries of the largest captured
    verify step (`verify_queries` per sequence; None without speculation)."""
    if verify_queries is None:
        return max_num_seqs
    sizes = verify_capture_sizes(max_num_seqs, verify_queries, MAX_VERIFY_GRAPH_ROWS)
    return max([max_num_seqs, *(size * verify_queries for size in sizes)])


class DecodeGraphs:
    """Graphs of the runner's decode step, each reading the decode buffers' views of its shape.

    A batch of n sequences is padded to the smallest captured size >= n (the
    buffers mark the padding rows), and that graph is replayed. With
    `verify_queries` (speculative decoding) the verify step, that many queries
    per sequence, has graphs of its own, for the sizes whose queries number at
    most `max_verify_rows` (`verify_capture_sizes`). The token ids a step takes from the previous step's
    samples are gathered inside the graph, and each graph's output stays in
    memory the graph owns, valid until the next replay.
    """

    def __init__(
        self,
        step: DecodeFunction,
        buffers: DecodeBuffers,
        max_num_seqs: int,
        verify_queries: int | None = None,
        max_verify_rows: int = 0,
    ):
        self.step = step
        self.buffers = buffers
        self.sizes = capture_sizes(max_num_seqs)
        self.verify_queries = verify_queries
        self.verify_sizes = []
        if verify_queries is not None:
            self.verify_sizes = verify_capture_sizes(max_num_seqs, verify_queries, max_verify_rows)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._capture_all()

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        shapes = [(size, 1) for size in self.sizes] + [(size, self.verify_queries) for size in self.verify_sizes]
        # largest first, so that smaller graphs fit in its pool
        for size, queries in sorted(shapes, key=lambda shape: -shape[0] * shape[1]):
            inputs = self.buffers.views(size, queries)
            input_ids, src_rows, positions, slot_mapping, context_lens, temperatures, seeds, seq_order = inputs[:8]
            state_slots = inputs[-1]
            # padding rows, as the buffers define them; the views of sizes overlap, so a larger
            # size's -1s would otherwise be read here as token ids and positions
            input_ids.zero_()
            positions.zero_()
            src_rows.fill_(-1)
            slot_mapping.fill_(-1)
            context_lens.zero_()
            temperatures.zero_()
            torch.arange(size, out=seq_order)
            if state_slots is not None:
                state_slots.fill_(self.buffers.scratch_state_slot)
            self.step(*inputs)  # compiles the kernels first
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self.outputs[size, queries] = self.step(*inputs)
            pool = graph.pool() if pool is None else pool
            self.graphs[size, queries] = graph
            torch.cuda.synchronize()

    def release(self) -> None:
        """Destroy every graph now rather than when Python collects this object."""
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.outputs.clear()

    def padded_size(self, num_seqs: int, queries: int = 1) -> int | None:
        """The captured size a batch of `num_seqs` replays, or None when it is too large for any graph."""
        sizes = self.sizes if queries == 1 else self.verify_sizes if queries == self.verify_queries else []
        return next((s for s in sizes if s >= num_seqs), None)

    def captured(self, size: int, queries: int = 1) -> bool:
        """Whether a graph of exactly `size` sequences of `queries` queries exists."""
        return (size, queries) in self.graphs

    def replay(self, size: int, queries: int = 1) -> torch.Tensor:
        """The output of the decode step whose inputs are in the buffers' views of that shape ([size *
        queries, ...])."""
        self.graphs[size, queries].replay()
        return self.outputs[size, queries]
