"""A stand-in for the decode CUDA graphs on the CPU, so that the runner's graph path runs in CPU tests."""

import torch

from nanovllm.worker.cuda_graphs import capture_sizes


class GraphsReplayedEagerly:
    """DecodeGraphs on CPU: `replay` runs the decode step exactly as a captured graph does, with every
    argument it was captured with (its sampling included), on the buffers' views of that shape; `replays`
    lists the shapes replayed."""

    def __init__(self, runner):
        self.step, self.buffers = runner._decode_step, runner.decode_buffers
        self.sizes = capture_sizes(runner.config.max_num_seqs)
        self.verify_queries = runner.verify_queries
        self.replays = []
        # as the runner gives the decode step before it captures the graphs
        rows = runner.config.max_num_seqs * (runner.verify_queries or 1)
        self.step.logits = torch.full((rows, runner.config.hf_config.vocab_size), float("nan"))

    def padded_size(self, num_seqs, queries=1):
        if queries not in (1, self.verify_queries):
            return None
        return next((s for s in self.sizes if s >= num_seqs), None)

    def captured(self, size, queries=1):
        return size in self.sizes and queries in (1, self.verify_queries)

    def replay(self, size, queries=1):
        self.replays.append((size, queries))
        return self.step(*self.buffers.views(size, queries))

    def release(self):
        pass
