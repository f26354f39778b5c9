"""The decode step's move back past rejected drafts (positions, cache slots and context lengths of the
sequences whose input token the step before sampled, by the drafts it rejected there), and a verify
step's check of its own drafts."""

import pytest
import torch

from nanovllm.spec_decode.verification import verify_padded
from nanovllm.worker.decode_step import check_drafts_in_step, moved_back

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []


def test_sequences_move_back_by_the_drafts_rejected_in_their_row_and_padding_stores_nothing():
    # 3 sequences of 3 queries, blocks of 4 tokens: the first took its token from row 1 of the step before
    # (2 drafts rejected there), the second from row 0 (none rejected), the third is padding
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=DEVICE)
    positions = as_tensor([9, 10, 11, 4, 5, 5, 0, 0, 0])
    block_tables = as_tensor([[[7, 3, 8, -1], [2, 5, -1, -1], [-1, -1, -1, -1]]])  # one cache group
    # the second sequence's third query pads (it repeats the last real one's position and stores nothing)
    slot_mapping = as_tensor([[8 * 4 + 1, 8 * 4 + 2, 8 * 4 + 3, 5 * 4 + 0, 5 * 4 + 1, -1, -1, -1, -1]])
    context_lens = positions + 1
    context_lens[6:] = 0
    src_rows = as_tensor([1, -1, -1, 0, -1, -1, -1, -1, -1])
    num_rejected = as_tensor([0, 2, 3])
    moved, slots, lens = moved_back(positions, slot_mapping, context_lens, block_tables, src_rows, num_rejected, 4)
    assert moved.tolist() == [7, 8, 9, 4, 5, 5, 0, 0, 0]
    # position 7 is in the sequence's second block (3), 8 and 9 in its third (8)
    assert slots.tolist() == [[3 * 4 + 3, 8 * 4 + 0, 8 * 4 + 1, 5 * 4 + 0, 5 * 4 + 1, -1, -1, -1, -1]]
    assert lens.tolist() == [8, 9, 10, 5, 6, 6, 0, 0, 0]


def test_every_cache_group_moves_its_slots_back_through_its_own_block_table():
    # 2 sequences of 2 queries, blocks of 4 tokens, two groups: the second slides and freed its first block
    # (-1), which no moved-back position reaches (the lookback kept the window's blocks); the first
    # sequence took its token from row 0, where 3 drafts were rejected
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=DEVICE)
    positions = as_tensor([13, 14, 6, 6])
    block_tables = as_tensor([[[1, 2, 3, 4], [5, 6, -1, -1]], [[-1, 7, 8, 9], [10, 11, -1, -1]]])
    # the second sequence's second query pads
    slot_mapping = as_tensor([[4 * 4 + 1, 4 * 4 + 2, 6 * 4 + 2, -1], [9 * 4 + 1, 9 * 4 + 2, 11 * 4 + 2, -1]])
    src_rows = as_tensor([0, -1, -1, -1])
    moved, slots, lens = moved_back(positions, slot_mapping, positions + 1, block_tables, src_rows, as_tensor([3]), 4)
    assert moved.tolist() == [10, 11, 6, 6] and lens.tolist() == [11, 12, 7, 7]
    # positions 10 and 11 lie in the third block of each group's table: 3 in the first, 8 in the second
    assert slots.tolist() == [[3 * 4 + 2, 3 * 4 + 3, 6 * 4 + 2, -1], [8 * 4 + 2, 8 * 4 + 3, 11 * 4 + 2, -1]]


def test_a_verify_step_checks_its_drafts_where_the_step_after_reads_them():
    # the padded verify step of test_verification, as the step's own inputs: each request's last token, then
    # its drafts; a padding query stores nothing (slot -1), whatever its input id
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=DEVICE)
    query_samples = as_tensor([5, 6, 8, 2, 4, 0, 0, 0, 3, 9, 9, 0])
    input_ids = as_tensor([1, 5, 6, 7, 2, 0, 0, 0, 3, 9, 9, 0])
    slot_mapping = as_tensor([10, 11, 12, 13, 20, -1, -1, -1, 30, 31, 32, -1])
    last_sampled, num_rejected, num_emitted = (as_tensor([-7] * 3) for _ in range(3))
    check_drafts_in_step(query_samples, input_ids, slot_mapping, last_sampled, num_rejected, num_emitted)
    expected = verify_padded(query_samples, input_ids.view(3, 4)[:, 1:], slot_mapping.view(3, 4)[:, 1:] >= 0)
    assert num_emitted.tolist() == expected.num_emitted.tolist() == [3, 1, 1]
    assert last_sampled.tolist() == expected.last_token_ids.tolist() == [8, 4, 3]
    assert num_rejected.tolist() == expected.num_rejected.tolist() == [1, 0, 2]
