"""Triton kernels: a mixture-of-experts batch's slots in runs of one expert each, padded to whole blocks.

Token t's j-th choice is slot p = t * top_k + j, its expert ids[p]. The
grouped GEMMs of `triton_moe.py` multiply blocks of BLOCK_M rows that must
each belong to one expert; this lays the slots out so:

1. `_rank_kernel`, grid (cdiv(P, BLOCK),): each slot takes the next place
   among its expert's slots with one atomic increment of the expert's count,
   so the places within an expert follow no particular order (each row's
   product is independent of the other rows of its block, so the results do
   not depend on it).
2. `_place_kernel`, grid (cdiv(max(P, blocks, experts), BLOCK),): from the
   counts, every program computes each expert's run (its count rounded up to
   whole blocks, the runs one after another) and then, for its share of
   indices i: slot i's row (its expert's run start + its place), expert i's
   padding rows (marked P), block i's expert (the number of runs ending at or
   before its first row: `experts` for a block past the last run), and, in
   program 0, the rows the runs fill.

Two launches and a zeroed count, where a sort and some thirty small PyTorch
launches take several times as long. Shapes depend only on the token count:
at most min(experts, P) experts are non-empty, so P + min(experts, P) *
(BLOCK_M - 1) rows always suffice, and a CUDA graph of the step stays valid.
"""

import torch
import triton
import triton.language as tl

_BLOCK_ELEMENTS = 8192  # a place program's [BLOCK, experts] comparisons, at most


@triton.jit(do_not_specialize=["num_slots"])  # one compile for every token count
def _rank_kernel(ids_ptr, counts_ptr, ranks_ptr, num_slots, BLOCK: tl.constexpr):
    slots = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot_ok = slots < num_slots
    experts = tl.load(ids_ptr + slots, mask=slot_ok, other=0)
    ranks = tl.atomic_add(counts_ptr + experts, 1, mask=slot_ok, sem="relaxed")
    tl.store(ranks_ptr + slots, ranks, mask=slot_ok)


@triton.jit(do_not_specialize=["num_slots", "num_blocks"])  # one compile for every token count
def _place_kernel(
    ids_ptr,
    counts_ptr,
    ranks_ptr,
    sorted_slots_ptr,
    block_experts_ptr,
    num_rows_ptr,
    num_slots,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)
    expert_ok = experts < num_experts
    counts = tl.load(counts_ptr + experts, mask=expert_ok, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # [BLOCK_E]: each run's rows
    ends = tl.cumsum(padded, axis=0)
    first = tl.program_id(0) * BLOCK
    i = first + tl.arange(0, BLOCK)

    if first < num_slots:  # slot i: its expert's run start (the runs of the experts before it) + its place
        slot_ok = i < num_slots
        slot_experts = tl.load(ids_ptr + i, mask=slot_ok, other=0)
        run_starts = tl.sum(tl.where(experts[None, :] < slot_experts[:, None], padded[None, :], 0), axis=1)
        places = tl.load(ranks_ptr + i, mask=slot_ok, other=0)
        tl.store(sorted_slots_ptr + run_starts + places, i, mask=slot_ok)

    if first < num_experts:  # expert i's padding: the rows of its run past its count
        i_ok = i < num_experts
        i_counts = tl.load(counts_ptr + i, mask=i_ok, other=0)
        i_starts = tl.sum(tl.where(experts[None, :] < i[:, None], padded[None, :], 0), axis=1)
        i_padded = (i_counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        pad = tl.arange(0, BLOCK_M)
        pad_rows = (i_starts + i_counts)[:, None] + pad[None, :]  # [BLOCK, BLOCK_M]
        pad_ok = i_ok[:, None] & (i_counts[:, None] + pad[None, :] < i_padded[:, None])
        tl.store(sorted_slots_ptr + pad_rows, tl.zeros(pad_rows.shape, tl.int32) + num_slots, mask=pad_ok)

    if first < num_blocks:  # block i: the runs that end at or before its first row
        runs_before = tl.sum((expert_ok[None, :] & (ends[None, :] <= i[:, None] * BLOCK_M)).to(tl.int32), axis=1)
        tl.store(block_experts_ptr + i, runs_before, mask=i < num_blocks)
    if tl.program_id(0) == 0:
        tl.store(num_rows_ptr, tl.sum(padded, axis=0))


def align_by_expert(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slots in runs of one expert each, padded to whole blocks of `block_m` rows.

    ids: [tokens, top_k] -> sorted_slots [rows] int32 (P = tokens * top_k on padding rows; the rows past
    num_rows unset), block_experts [rows / block_m] int32, num_rows [1] int32 (the rows the runs fill)
    """
    num_slots = ids.numel()
    max_rows = triton.cdiv(num_slots + min(num_experts, num_slots) * (block_m - 1), block_m) * block_m
    num_blocks = max_rows // block_m
    counts = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
    ranks = torch.empty(num_slots, dtype=torch.int32, device=ids.device)
    sorted_slots = torch.empty(max_rows, dtype=torch.int32, device=ids.device)
    block_experts = torch.empty(num_blocks, dtype=torch.int32, device=ids.device)
    num_rows = torch.empty(1, dtype=torch.int32, device=ids.device)
    ids = ids.contiguous()
    block_e = triton.next_power_of_2(num_experts)
    block = max(16, min(_BLOCK_ELEMENTS // max(block_e, block_m), 1024))
    _rank_kernel[(triton.cdiv(num_slots, 1024),)](ids, counts, ranks, num_slots, BLOCK=1024)
    _place_kernel[(triton.cdiv(max(num_slots, num_blocks, num_experts), block),)](
        ids,
        counts,
        ranks,
        sorted_slots,
        block_experts,
        num_rows,
        num_slots,
        num_experts,
        num_blocks,
        BLOCK_M=block_m,
        BLOCK=block,
        BLOCK_E=block_e,
    )
    return sorted_slots, block_experts, num_rows
