"""Token embedding and LM head, both split along the vocabulary across ranks."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nanovllm.layers.all_reduce import all_reduce
from nanovllm.layers.linear import divide, linear
from nanovllm.utils.loader import shard
from nanovllm.utils.parallel import tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary's rows."""

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.rows_per_rank = divide(vocab_size, self.tp_size, "vocabulary size")
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        param.data.copy_(shard(loaded, 0, self.vocab_start, self.rows_per_rank))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [tokens] -> [tokens, hidden]
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.rows_per_rank)
        y = F.embedding(local.clamp(0, self.rows_per_rank - 1), self.weight) * mine.unsqueeze(1)
        return all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """Hidden states to logits. The runner passes only the rows that sample.

    Each rank computes the logits of its own slice of the vocabulary; `gather` brings the slices to rank 0.
    """

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's slice of the logits (the whole vocabulary's with one rank), written to `out` when given
        (a buffer that outlives the call)."""
        # x: [sampling rows, hidden] -> logits: [sampling rows, vocab / ranks]
        if x.device.type != "cpu":
            return linear(x, self.weight, out=out)  # a few rows: the Triton GEMV
        # MKL runs this [vocab, hidden] @ [hidden, seqs] orientation faster
        # than x @ weight.T when there are few rows; same products,
        # another summation order.
        logits = (self.weight @ x.T).T
        return logits.contiguous() if out is None else out.copy_(logits)

    def gather(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Every rank's slice of the logits joined on rank 0 ([rows, vocab]); None on the other ranks.
        Every rank calls it."""
        if self.tp_size == 1:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.tp_size)] if self.tp_rank == 0 else None
        dist.gather(logits, parts, dst=0)
        return torch.cat(parts, dim=-1) if self.tp_rank == 0 else None
