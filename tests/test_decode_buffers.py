"""DecodeBuffers: one decode step's inputs, padded to a graph size, in one buffer."""

import torch

from nanovllm.engine.decode_buffers import DecodeBuffers
from nanovllm.engine.sequence import Sequence
from nanovllm.sampling_params import SamplingParams

BLOCK_SIZE = 4
WIDTH = 8


def sequence(num_tokens: int, first_block: int) -> Sequence:
    seq = Sequence(list(range(1, num_tokens + 1)), SamplingParams(), BLOCK_SIZE)
    seq.block_table = list(range(first_block, first_block + seq.num_blocks))
    return seq


def test_real_rows_hold_last_token_position_slot_length_and_table():
    buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"))
    seqs = [sequence(6, first_block=100), sequence(9, first_block=200)]
    ids, positions, slots, lens, tables = buffers.load(seqs, 2)
    assert ids.tolist() == [6, 9]
    assert positions.tolist() == [5, 8]
    assert slots.tolist() == [101 * BLOCK_SIZE + 1, 202 * BLOCK_SIZE + 0]
    assert lens.tolist() == [6, 9]
    assert tables.tolist() == [[100, 101] + [-1] * 6, [200, 201, 202] + [-1] * 5]


def test_padding_rows_are_valid_indices_after_a_smaller_step_left_other_fields_there():
    # A step of one row lays slots, lengths and -1-padded tables where a step of
    # 16 rows reads its token ids and positions: padding must not inherit them,
    # or a graph's embedding and rotary lookups index out of range.
    buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"))
    buffers.load([sequence(30, first_block=5000)], 1)
    ids, positions, slots, lens, tables = buffers.load([sequence(3, first_block=7), sequence(5, first_block=9)], 16)
    assert ids[2:].tolist() == [0] * 14
    assert positions[2:].tolist() == [0] * 14
    assert slots[2:].tolist() == [-1] * 14
    assert lens[2:].tolist() == [0] * 14
    assert (tables[2:] == -1).all()
    assert ids[:2].tolist() == [3, 5] and positions[:2].tolist() == [2, 4]
