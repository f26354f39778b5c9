"""The check of point-mass drafts (the n-gram method's) on the device.

A request with d drafts has d + 1 sampling rows: the position of each draft and
the one after the last. Each row is sampled with the request's own sampler, as
it would be without drafts (same settings, same seeded noise at the same
position), and the drafts are kept while they equal the row sampled at their
position; the sample at the first mismatch (or after the last draft) is the
next token. For a point-mass draft this is exact rejection sampling: a draft x
is kept with probability p(x), and otherwise the token drawn follows p without
x. Greedy rows take the argmax, so a greedy request keeps the longest prefix of
drafts that greedy decoding would have produced.
"""

from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

ToDevice = Callable[[list | np.ndarray, torch.dtype], torch.Tensor]  # host values -> a device tensor, queued


@dataclass
class VerifiedDrafts:
    """What a speculative step keeps, per sampling request: how many of its rows' tokens it emits (the
    kept drafts and the token after them) and the last of them, where its next step's input comes
    from, and how many drafts it rejected, by which a next step launched before the check moves back."""

    row_starts: list[int]  # each request's first sampling row
    num_emitted: torch.Tensor  # [requests] int64, from 1 to drafts + 1
    last_token_ids: torch.Tensor  # [requests] int64
    num_rejected: torch.Tensor  # [requests] int64, from 0 to drafts


def first_sampling_rows(draft_token_ids: list[list[int]], rows_per_request: int | None = None) -> list[int]:
    """Each request's first sampling row, when each has one row per draft and one after them, or
    `rows_per_request` rows (a verify step padded to fixed shapes)."""
    if rows_per_request is not None:
        return list(range(0, len(draft_token_ids) * rows_per_request, rows_per_request))
    return list(accumulate((len(drafts) + 1 for drafts in draft_token_ids), initial=0))[:-1]


def _num_kept(matches: torch.Tensor) -> torch.Tensor:
    """The length of each row's leading run of matches: [requests, width] bool -> [requests] int64 (a
    reduction rather than a cumulative product, so that it compiles into one kernel with what surrounds it)."""
    width = matches.size(1)
    positions = torch.arange(width, device=matches.device)
    return torch.where(matches, width, positions).amin(dim=1)


def verify_drafts(sampled: torch.Tensor, draft_token_ids: list[list[int]], to_device: ToDevice) -> VerifiedDrafts:
    """Keep each request's drafts while they equal the tokens sampled at their positions. `sampled`:
    [rows] int64, the requests' rows one after another (drafts + 1 each)."""
    starts = first_sampling_rows(draft_token_ids)
    width = max(len(drafts) for drafts in draft_token_ids) + 1
    # [requests, width]: the drafts, then -1 at the position after the last and as padding, so that a run
    # of matches always ends within a request's own rows (sampled ids are >= 0)
    drafts = to_device([ids + [-1] * (width - len(ids)) for ids in draft_token_ids], torch.int64)
    first_rows = to_device(starts, torch.int64)
    rows = (first_rows.unsqueeze(1) + torch.arange(width, device=sampled.device)).clamp_max_(sampled.numel() - 1)
    num_emitted = _num_kept(sampled[rows] == drafts) + 1
    num_rejected = (drafts >= 0).sum(dim=1) + 1 - num_emitted
    return VerifiedDrafts(starts, num_emitted, sampled[first_rows + num_emitted - 1], num_rejected)


def drafts_in_step(input_ids: torch.Tensor, slot_mapping: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A verify step's drafts, from its own inputs: the ids after each request's last token, and which of them
    are drafts (a padding query stores nothing: its slot is -1)."""
    # input_ids, slot_mapping: [size * queries] -> draft_ids, is_draft: [size, queries - 1]
    queries = input_ids.numel() // size
    return input_ids.view(size, queries)[:, 1:], slot_mapping.view(size, queries)[:, 1:] >= 0


def check_padded(
    sampled: torch.Tensor, draft_ids: torch.Tensor, is_draft: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The check of a verify step padded to fixed shapes, on tensors alone (a CUDA graph captures it):
    each request's tokens emitted, last token and drafts rejected, [requests] int64 each. `sampled`:
    [requests * queries] int64, each request's rows one after another; `draft_ids`, `is_draft`: [requests,
    queries - 1], the tokens each request's step computed after its last one and which of them are drafts
    (the rest pad)."""
    num_requests, width = draft_ids.shape
    rows = sampled.view(num_requests, width + 1)
    num_emitted = _num_kept((rows[:, :-1] == draft_ids) & is_draft) + 1
    last_token_ids = rows.gather(1, (num_emitted - 1).unsqueeze(1)).squeeze(1)
    num_rejected = is_draft.sum(dim=1) + 1 - num_emitted
    return num_emitted, last_token_ids, num_rejected


def verify_padded(sampled: torch.Tensor, draft_ids: torch.Tensor, is_draft: torch.Tensor) -> VerifiedDrafts:
    """`verify_drafts` for a verify step padded to fixed shapes, whose drafts are already on the device (the
    step's own inputs): no copy from the host. Arguments as `check_padded`'s."""
    queries = draft_ids.size(1) + 1
    return VerifiedDrafts(list(range(0, sampled.numel(), queries)), *check_padded(sampled, draft_ids, is_draft))
