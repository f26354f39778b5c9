"""Per-step attention metadata: set by the model runner for one forward pass, read by attention layers."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class OneQuerySequences:
    """Which sequences of a varlen step have one query: a recurrent layer steps them with its one-token kernel
    rather than as chunks of one token beside the prompts', each of which costs a whole chunk's work."""

    seqs: torch.Tensor  # [n] int64: the sequences of one query
    rows: torch.Tensor  # [n] int64: their tokens' rows
    others: torch.Tensor  # [m] int64: every other sequence
    num_others: int  # m, on the host


@dataclass
class Context:
    """What the attention layers need to know about the current step.

    Prefill packs every sequence's new tokens (a whole prompt, a prompt chunk
    or a single decode token) one after another: `cu_seqlens_q`/`cu_seqlens_k`
    are the cumulative query and key lengths (the key length counts the cached
    prefix too). `block_tables` is set when some sequence reads a cached
    prefix, and always over a cache whose keys are all read back from it
    (`KVCacheSpec.prefill_reads_cache`). Decode has one query per sequence,
    reading `context_lens[i]` keys through `block_tables[i]`; `max_seqlen_k` is
    the largest of them. A verify step (speculative decoding) is a decode step
    of `queries_per_seq` queries per sequence, one after another: the last
    token and its drafts, padded to that count; `context_lens` then has a
    length per query (what each sees: its position + 1) and `block_tables` a
    row per sequence.
    `seq_order`, where set, lists the decode rows longest context first, the
    order decode attention starts them in when it takes one split per row.

    `slot_mapping` and `block_tables` are those of cache group 0
    (`CacheLayout.groups`); a model of several groups carries the others' in
    `groups`, one context each, the same step but for those two fields
    (`for_group`). A one-group model's context has none, and is read as ever.
    """

    is_prefill: bool = False
    slot_mapping: torch.Tensor | None = None  # [num_tokens]; -1 = do not store
    cu_seqlens_q: torch.Tensor | None = None  # [num_seqs + 1]
    cu_seqlens_k: torch.Tensor | None = None  # [num_seqs + 1]
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    seqlens_q: list[int] | None = None  # host copies, for loops that need them
    seqlens_k: list[int] | None = None
    context_lens: torch.Tensor | None = None  # [num_seqs]
    block_tables: torch.Tensor | None = None  # [num_seqs, max_blocks]; -1 pads
    seq_order: torch.Tensor | None = None  # [num_seqs]
    queries_per_seq: int = 1
    groups: tuple["Context", ...] = ()  # cache groups 1 .. G-1: their slots and block tables
    # [num_seqs] int64: each sequence's state slot (recurrent layers; padded decode rows get the scratch slot)
    state_slots: torch.Tensor | None = None
    # a varlen step's sequences of one query (decodes beside prompt chunks), which recurrent layers step apart
    one_query: "OneQuerySequences | None" = None

    def for_group(self, group: int) -> "Context":
        """The context of the layers of cache group `group`: this one for group 0, else that group's."""
        return self if group == 0 else self.groups[group - 1]

    def with_groups(self, slot_mappings: torch.Tensor, block_tables: torch.Tensor | None) -> "Context":
        """This context, group 0's, with each other group's: its slots `slot_mappings[g]` and block tables
        `block_tables[g]` (None: no table is read); this very context when there is one group. Built once
        per step, so that a layer's look-up costs an index."""
        # slot_mappings: [groups, tokens]; block_tables: [groups, seqs, max_blocks]
        if slot_mappings.size(0) == 1:
            return self
        others = tuple(
            replace(self, slot_mapping=slot_mappings[g], block_tables=None if block_tables is None else block_tables[g])
            for g in range(1, slot_mappings.size(0))
        )
        return replace(self, groups=others)

    def query_block_tables(self) -> torch.Tensor:
        """[decode queries, max_blocks]: each decode query's sequence's block table, for a backend that
        attends query by query."""
        if self.queries_per_seq == 1:
            return self.block_tables
        return self.block_tables.repeat_interleave(self.queries_per_seq, dim=0)


# per thread: engines in different threads of one process (an online engine beside
# an offline one) run their forward passes independently
_LOCAL = threading.local()


@contextmanager
def forward_context(context: Context) -> Iterator[None]:
    """Make `context` the current step's for the duration of one forward pass; forwards do not nest."""
    if getattr(_LOCAL, "context", None) is not None:
        raise RuntimeError("a forward context is already set: one forward pass may not run inside another")
    _LOCAL.context = context
    try:
        yield
    finally:
        _LOCAL.context = None


def get_context() -> Context:
    """The context of the forward pass running in this thread."""
    context = getattr(_LOCAL, "context", None)
    assert context is not None, "attention ran outside a forward pass of the model runner"
    return context
