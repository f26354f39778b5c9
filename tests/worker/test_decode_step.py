"""The decode step's move back past rejected drafts: positions, cache slots and context lengths of the
sequences whose input token the step before sampled, by the drafts it rejected there."""

import torch

from nanovllm.worker.decode_step import moved_back

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_sequences_move_back_by_the_drafts_rejected_in_their_row_and_padding_stores_nothing():
    # 3 sequences of 3 queries, blocks of 4 tokens: the first took its token from row 1 of the step before
    # (2 drafts rejected there), the second from row 0 (none rejected), the third is padding
    as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=DEVICE)
    positions = as_tensor([9, 10, 11, 4, 5, 5, 0, 0, 0])
    block_tables = as_tensor([[7, 3, 8, -1], [2, 5, -1, -1], [-1, -1, -1, -1]])
    # the second sequence's third query pads (it repeats the last real one's position and stores nothing)
    slot_mapping = as_tensor([8 * 4 + 1, 8 * 4 + 2, 8 * 4 + 3, 5 * 4 + 0, 5 * 4 + 1, -1, -1, -1, -1])
    context_lens = positions + 1
    context_lens[6:] = 0
    src_rows = as_tensor([1, -1, -1, 0, -1, -1, -1, -1, -1])
    num_rejected = as_tensor([0, 2, 3])
    moved, slots, lens = moved_back(positions, slot_mapping, context_lens, block_tables, src_rows, num_rejected, 4)
    assert moved.tolist() == [7, 8, 9, 4, 5, 5, 0, 0, 0]
    # position 7 is in the sequence's second block (3), 8 and 9 in its third (8)
    assert slots.tolist() == [3 * 4 + 3, 8 * 4 + 0, 8 * 4 + 1, 5 * 4 + 0, 5 * 4 + 1, -1, -1, -1, -1]
    assert lens.tolist() == [8, 9, 10, 5, 6, 6, 0, 0, 0]
