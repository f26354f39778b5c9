"""A varlen step's inputs: prompt chunks, and any decodes and drafts beside them, packed one request after
another (a decode step's inputs, fixed in shape, are `DecodeBuffers`).

Request i computes its tokens from position num_computed_tokens[i] on; its
queries see the cached prefix and the request's own tokens up to theirs. The
packed token order gives every per-token input ([tokens]: input ids, the row
of the previous step's samples a placeholder takes its id from, positions,
and per cache group the cache slots), and `cu_q`, the cumulative query
lengths, says where each request's tokens start. On a model with recurrent
layers the context also holds each request's state slot. Built on the host at
each step and copied to the device without waiting.
"""

from itertools import accumulate, chain

import numpy as np
import torch

from nanovllm.core.scheduler_output import PLACEHOLDER, SchedulerOutput
from nanovllm.spec_decode.verification import ToDevice
from nanovllm.utils.context import Context, OneQuerySequences


def varlen_inputs(
    out: SchedulerOutput,
    src_rows: list[int],
    block_size: int,
    new_keys_from_cache: bool,
    to_device: ToDevice,
    has_state: bool = False,
) -> tuple[Context, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """The step's attention context (every cache group's, `Context.for_group`), input ids, source rows and
    positions ([tokens] each, int64), and `cu_q`.

    `src_rows[i]` is the row of the previous step's samples that holds request i's token still in flight (-1:
    none); `new_keys_from_cache`: the cache gives back other keys than it was given (FP8), so the new
    tokens' keys are read back from it too, so that they match a cached prefix's; `has_state`: the model has
    recurrent layers, which read each request's `out.state_slots` entry."""
    seqlens_q = out.num_scheduled_tokens
    seqlens_k = [start + n for start, n in zip(out.num_computed_tokens, seqlens_q)]
    num_groups = len(out.block_tables[0])
    positions, token_src_rows = [], []
    slots = [[] for _ in range(num_groups)]  # [groups][tokens]
    for ids, tables, start, end, src in zip(
        out.token_ids, out.block_tables, out.num_computed_tokens, seqlens_k, src_rows
    ):
        positions += range(start, end)
        for group_slots, table in zip(slots, tables, strict=True):
            group_slots += _slots(table, start, end, block_size)
        token_src_rows += [src if token_id == PLACEHOLDER else -1 for token_id in ids]
    cu_q = list(accumulate(seqlens_q, initial=0))
    cu_k = list(accumulate(seqlens_k, initial=0))
    reads_cache = any(out.num_computed_tokens) or new_keys_from_cache
    slot_mappings = to_device(slots, torch.int64)  # [groups, tokens]
    block_tables = _padded_tables(out.block_tables, to_device) if reads_cache else None
    context = Context(
        is_prefill=True,
        slot_mapping=slot_mappings[0],  # [tokens]
        cu_seqlens_q=to_device(cu_q, torch.int32),  # [requests + 1]
        cu_seqlens_k=to_device(cu_k, torch.int32),  # [requests + 1]
        max_seqlen_q=max(seqlens_q),
        max_seqlen_k=max(seqlens_k),
        seqlens_q=seqlens_q,
        seqlens_k=seqlens_k,
        block_tables=None if block_tables is None else block_tables[0],  # [requests, width]
        state_slots=to_device(out.state_slots, torch.int64) if has_state else None,  # [requests]
        one_query=_one_query_sequences(seqlens_q, cu_q, to_device) if has_state else None,
    ).with_groups(slot_mappings, block_tables)
    input_ids = to_device(list(chain.from_iterable(out.token_ids)), torch.int64)
    return context, input_ids, to_device(token_src_rows, torch.int64), to_device(positions, torch.int64), cu_q


def _one_query_sequences(seqlens_q: list[int], cu_q: list[int], to_device: ToDevice) -> OneQuerySequences | None:
    """The step's sequences of one query, their rows and the other sequences; None where there are none."""
    ones = [i for i, n in enumerate(seqlens_q) if n == 1]
    if not ones:
        return None
    others = [i for i, n in enumerate(seqlens_q) if n != 1]
    return OneQuerySequences(
        to_device(ones, torch.int64), to_device([cu_q[i] for i in ones], torch.int64), to_device(others, torch.int64),
        len(others),
    )  # fmt: skip


def scored_tokens(out: SchedulerOutput, cu_q: list[int]) -> list[int]:
    """The tokens of a varlen step whose hidden states give its sampling rows: each sampling request's last
    token and, before it, the tokens that precede each of its drafts."""
    drafts = iter(out.draft_token_ids or [])
    rows = []
    for i, samples in enumerate(out.samples):
        if samples:
            d = len(next(drafts)) if out.draft_token_ids is not None else 0
            rows += range(cu_q[i + 1] - 1 - d, cu_q[i + 1])
    return rows


def _padded_tables(block_tables: list[list[list[int]]], to_device: ToDevice) -> torch.Tensor:
    """Every request's block table of each cache group, -1 padded to the longest: [groups, requests, width].
    Filled through numpy in one pass: a nested list of 256 requests' tables took torch.tensor milliseconds."""
    by_group = list(zip(*block_tables))  # [groups][requests] -> table
    widths = np.array([[len(table) for table in group] for group in by_group], dtype=np.int64)  # [groups, requests]
    padded = np.full((*widths.shape, int(widths.max())), -1, dtype=np.int32)
    entries = chain.from_iterable(chain.from_iterable(by_group))
    padded[np.arange(padded.shape[2]) < widths[..., None]] = np.fromiter(entries, np.int32, int(widths.sum()))
    return to_device(padded, torch.int32)


def _slots(table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Flat cache slots of positions start..end-1 of a sequence with block table `table` (-1 each: no table)."""
    bs = block_size
    return [table[p // bs] * bs + p % bs for p in range(start, end)] if table else [-1] * (end - start)
