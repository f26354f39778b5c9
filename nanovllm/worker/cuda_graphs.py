"""CUDA graphs of the decode step, one per batch size, replayed with padded slots."""

from collections.abc import Callable

import torch

from nanovllm.utils.context import Context, forward_context
from nanovllm.worker.decode_buffers import DecodeBuffers

# (input_ids, src_rows, positions, temperatures, seeds) -> the step's output (logits, or hidden states
# with several ranks): the runner's DecodeStep
DecodeFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to min(max_num_seqs, 512), which is always included."""
    largest = min(max_num_seqs, 512)
    sizes = [s for s in [1, 2, 4, 8, *range(16, largest + 1, 16)] if s <= largest]
    return sizes if sizes[-1] == largest else sizes + [largest]


class DecodeGraphs:
    """Graphs of the runner's decode step, each reading the decode buffers' views of its size.

    A batch of n sequences is padded to the smallest captured size >= n (the
    buffers mark the padding rows), and that graph is replayed. The token ids
    a step takes from the previous step's samples are gathered inside the graph,
    and each graph's output stays in memory the graph owns, valid until the
    next replay.
    """

    def __init__(self, step: DecodeFunction, buffers: DecodeBuffers, max_num_seqs: int):
        self.step = step
        self.buffers = buffers
        self.sizes = capture_sizes(max_num_seqs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._capture_all()

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for size in reversed(self.sizes):  # largest first, so smaller graphs fit in its pool
            input_ids, src_rows, positions, slot_mapping, context_lens, temperatures, seeds, seq_order, block_tables = (
                self.buffers.views(size)
            )
            # padding rows, as the buffers define them; the views of sizes overlap, so a larger
            # size's -1s would otherwise be read here as token ids and positions
            input_ids.zero_()
            positions.zero_()
            src_rows.fill_(-1)
            slot_mapping.fill_(-1)
            context_lens.zero_()
            temperatures.zero_()
            torch.arange(size, out=seq_order)
            context = Context(
                is_prefill=False,
                slot_mapping=slot_mapping,
                context_lens=context_lens,
                block_tables=block_tables,
                seq_order=seq_order,
            )
            inputs = (input_ids, src_rows, positions, temperatures, seeds)
            with forward_context(context):
                self.step(*inputs)  # compiles the kernels first
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool):
                    self.outputs[size] = self.step(*inputs)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
            torch.cuda.synchronize()

    def release(self) -> None:
        """Destroy every graph now rather than when Python collects this object."""
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.outputs.clear()

    def padded_size(self, num_seqs: int) -> int | None:
        """The captured size a batch of `num_seqs` replays, or None when it is too large for any graph."""
        return next((s for s in self.sizes if s >= num_seqs), None)

    def captured(self, size: int) -> bool:
        """Whether a graph of exactly `size` rows exists."""
        return size in self.graphs

    def replay(self, size: int) -> torch.Tensor:
        """The output of the decode step whose inputs are in the buffers' views of `size` ([size, ...])."""
        self.graphs[size].replay()
        return self.outputs[size]
