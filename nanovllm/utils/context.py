"""Per-step attention metadata, set by the model runner and read by attention layers."""

from dataclasses import dataclass

import torch


@dataclass
class Context:
    """What the attention layers need to know about the current step.

    Prefill packs every sequence's new tokens (a whole prompt, a prompt chunk
    or a single decode token) one after another: `cu_seqlens_q`/`cu_seqlens_k`
    are the cumulative query and key lengths (the key length counts the cached
    prefix too). `block_tables` is set when some sequence reads a cached
    prefix. `logits_indices` are the packed rows whose logits are computed: the
    last token of each sequence that samples this step (a chunk that stops
    short of its prompt's end samples nothing). Decode has one query per sequence,
    reading `context_lens[i]` keys through `block_tables[i]`; `max_seqlen_k`
    is the largest of them.
    """

    is_prefill: bool = False
    slot_mapping: torch.Tensor | None = None      # [num_tokens]; -1 = do not store
    cu_seqlens_q: torch.Tensor | None = None      # [num_seqs + 1]
    cu_seqlens_k: torch.Tensor | None = None      # [num_seqs + 1]
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    seqlens_q: list[int] | None = None            # host copies, for loops that need them
    seqlens_k: list[int] | None = None
    context_lens: torch.Tensor | None = None      # [num_seqs]
    block_tables: torch.Tensor | None = None      # [num_seqs, max_blocks]; -1 pads
    logits_indices: torch.Tensor | None = None    # [sampled seqs], prefill only


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(context: Context) -> None:
    global _CONTEXT
    _CONTEXT = context


def reset_context() -> None:
    set_context(Context())
