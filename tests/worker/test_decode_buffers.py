"""DecodeBuffers: one decode step's inputs, padded to a graph size, in one buffer, written through
two host buffers in turn; with several cache groups, each group's slots from its own block table; on a model
with recurrent state, each sequence's state slot, padding rows the scratch slot."""

import torch

from nanovllm.core.scheduler_output import PLACEHOLDER
from nanovllm.worker.decode_buffers import DecodeBuffers

BLOCK_SIZE = 4
WIDTH = 8


def make_buffers() -> DecodeBuffers:
    return DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"))


def blocks(num_tokens: int, first_block: int) -> list[list[int]]:
    """The block tables of a model of one cache group: one table holding `num_tokens` tokens, numbered
    from `first_block`."""
    return [list(range(first_block, first_block + (num_tokens + BLOCK_SIZE - 1) // BLOCK_SIZE))]


def test_real_rows_hold_token_position_slot_length_temperature_and_table():
    # a request of 6 tokens computes its last one at position 5; one of 9 tokens at position 8
    ids, src, positions, slots, lens, temperatures, _, _, tables, state_slots = make_buffers().load(
        [6, 9], [-1, -1], [5, 8], [0.0, 0.7], [blocks(6, first_block=100), blocks(9, first_block=200)], 2
    )
    assert state_slots is None  # the model keeps no recurrent state
    assert ids.tolist() == [6, 9]
    assert temperatures.dtype == torch.float64 and temperatures.tolist() == [0.0, 0.7]
    assert src.tolist() == [-1, -1]
    assert positions.tolist() == [5, 8]
    assert slots.tolist() == [[101 * BLOCK_SIZE + 1, 202 * BLOCK_SIZE + 0]]
    assert lens.tolist() == [6, 9]
    assert tables.tolist() == [[[100, 101] + [-1] * 6, [200, 201, 202] + [-1] * 5]]


def test_src_rows_of_real_rows_are_kept_and_padding_rows_get_minus_one():
    # both rows' tokens are the previous step's samples, in the other order
    ids, src, *_ = make_buffers().load(
        [PLACEHOLDER, PLACEHOLDER], [1, 0], [3, 4], [1.0, 1.0], [blocks(4, first_block=1), blocks(5, first_block=2)], 4
    )
    assert src.tolist() == [1, 0, -1, -1]
    assert ids[2:].tolist() == [0, 0]


def test_padding_rows_are_valid_indices_after_a_smaller_step_left_other_fields_there():
    # A step of one row lays its src row, position, slot, length, temperature and -1-padded table
    # where a step of 16 rows reads its token ids: padding must not inherit them, or
    # a graph's embedding lookup indexes out of range. The steps alternate host
    # buffers, so a one-row step goes into each.
    buffers = make_buffers()
    for _ in range(2):
        buffers.load([30], [-1], [29], [0.5], [blocks(30, first_block=5000)], 1)
    ids, src, positions, slots, lens, temperatures, _, _, tables, _ = buffers.load(
        [3, 5], [-1, -1], [2, 4], [0.5, 0.5], [blocks(3, first_block=7), blocks(5, first_block=9)], 16
    )
    assert ids[2:].tolist() == [0] * 14
    assert src[2:].tolist() == [-1] * 14
    assert positions[2:].tolist() == [0] * 14
    assert slots[0, 2:].tolist() == [-1] * 14
    assert lens[2:].tolist() == [0] * 14
    assert temperatures[2:].tolist() == [0.0] * 14
    assert (tables[0, 2:] == -1).all()
    assert ids[:2].tolist() == [3, 5] and positions[:2].tolist() == [2, 4]


def test_seq_order_lists_the_rows_longest_context_first_and_padding_last():
    *_, lens, _, _, order, _, _ = make_buffers().load(
        [1, 2, 3], [-1, -1, -1], [4, 9, 6], [0.0] * 3, [blocks(5, 10), blocks(10, 20), blocks(7, 30)], 4
    )
    assert lens.tolist() == [5, 10, 7, 0]
    assert order.tolist() == [1, 2, 0, 3]


def test_consecutive_loads_use_different_host_buffers_and_leave_the_previous_one_alone():
    buffers = make_buffers()
    # the device views of one size lie end to end at the buffer's start: joined, they are the copied region
    as_int64 = lambda views: torch.cat([view.view(torch.int64).flatten() for view in views if view is not None])
    first = as_int64(
        buffers.load([6, 9], [-1, -1], [5, 8], [0.6, 0.6], [blocks(6, first_block=100), blocks(9, first_block=200)], 2)
    )
    second = as_int64(
        buffers.load(
            [PLACEHOLDER, 4], [0, -1], [2, 3], [0.6, 0.0], [blocks(3, first_block=7), blocks(4, first_block=9)], 2
        )
    )
    used = len(first)
    assert not torch.equal(first, second)
    # the second step's inputs came from the other host buffer; the first step's copy source is intact
    assert torch.equal(buffers.hosts[0][:used], first)
    assert torch.equal(buffers.hosts[1][:used], second)


def test_each_step_gets_fresh_seeds_that_the_buffers_seed_reproduces():
    def seeds_of_three_steps(seed: int) -> list[list[int]]:
        buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"), seed)
        return [
            buffers.load([3, 5], [-1, -1], [2, 4], [1.0, 1.0], [blocks(3, 7), blocks(5, 9)], 4)[6].tolist()
            for _ in range(3)
        ]

    steps = seeds_of_three_steps(seed=1)
    assert len({s for step in steps for s in step}) == 12  # every row of every step its own
    assert steps == seeds_of_three_steps(seed=1) and steps != seeds_of_three_steps(seed=2)


def test_a_verify_step_lays_out_each_sequences_last_token_drafts_and_padding_queries():
    # three queries per sequence: the first has two drafts, the second one, the third none; a padding
    # sequence follows
    buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"), max_queries=3)
    ids, src, positions, slots, lens, temperatures, seeds, order, tables, _ = buffers.load(
        [PLACEHOLDER, 9, 4],
        [2, -1, -1],
        [3, 6, 1],
        [0.0, 0.7, 0.5],
        [blocks(6, first_block=100), blocks(8, first_block=200), blocks(2, first_block=300)],
        4,
        drafts=[[11, 12], [13], []],
        queries=3,
    )
    assert ids.tolist() == [PLACEHOLDER, 11, 12, 9, 13, 0, 4, 0, 0, 0, 0, 0]
    assert src.tolist() == [2, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]
    # padding queries repeat the last real one's position (and so its keys) and store nothing
    assert positions.tolist() == [3, 4, 5, 6, 7, 7, 1, 1, 1, 0, 0, 0]
    assert lens.tolist() == [4, 5, 6, 7, 8, 8, 2, 2, 2, 0, 0, 0]
    assert slots.tolist() == [[403, 404, 405, 806, 807, -1, 1201, -1, -1, -1, -1, -1]]
    assert temperatures.tolist() == [0.0] * 3 + [0.7] * 3 + [0.5] * 3 + [0.0] * 3
    assert len(set(seeds.tolist())) == 12
    assert order.tolist() == [1, 0, 2, 3]
    assert tables[0, :3, :2].tolist() == [[100, 101], [200, 201], [300, -1]]
    # the views of this shape are where the device copy put them
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(buffers.views(4, 3), (ids, src, positions)))


def test_each_cache_group_gets_its_slots_from_its_own_block_table():
    # two groups: the first holds every block, the second slides and its first block, behind every window,
    # went back to the pool (-1); a verify step of two queries, the second sequence without a draft
    buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"), max_queries=2, num_groups=2)
    _, _, positions, slots, *_, tables, _ = buffers.load(
        [5, 7],
        [-1, -1],
        [9, 2],
        [0.0, 0.0],
        [[[10, 11, 12], [-1, 21, 22]], [[30], [40]]],
        4,
        drafts=[[8], []],
        queries=2,
    )
    assert positions.tolist() == [9, 10, 2, 2, 0, 0, 0, 0]
    # positions 9 and 10 lie in the first sequence's third block, at offsets 1 and 2; the padding query stores nothing
    assert slots.tolist() == [
        [12 * 4 + 1, 12 * 4 + 2, 30 * 4 + 2, -1, -1, -1, -1, -1],
        [22 * 4 + 1, 22 * 4 + 2, 40 * 4 + 2, -1, -1, -1, -1, -1],
    ]
    assert tables[:, :2, :3].tolist() == [[[10, 11, 12], [30, -1, -1]], [[-1, 21, 22], [40, -1, -1]]]
    assert (tables[:, :, 3:] == -1).all() and (tables[:, 2:] == -1).all()
    # the groups' tables and slots lie where the device views of this shape read them
    device_views = buffers.views(4, 2)
    assert device_views[3].data_ptr() == slots.data_ptr() and device_views[8].data_ptr() == tables.data_ptr()


def test_padding_rows_of_every_group_read_nothing_stale():
    # steps of 8 sequences filled both host buffers; a step of 1 padded to 2 leaves -1 in each group's
    # padding slots and tables
    buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"), num_groups=2)
    for _ in range(2):
        buffers.load([1] * 8, [-1] * 8, [6] * 8, [0.0] * 8, [[[3, 4], [5, 6]]] * 8, 8)
    _, _, _, slots, *_, tables, _ = buffers.load([1], [-1], [1], [0.0], [[[7], [9]]], 2)
    assert slots.tolist() == [[7 * 4 + 1, -1], [9 * 4 + 1, -1]]
    assert tables.tolist() == [[[7] + [-1] * 7, [-1] * 8], [[9] + [-1] * 7, [-1] * 8]]


def test_each_sequence_has_its_state_slot_and_padding_rows_the_scratch_slot():
    # slots 0..29 and the scratch slot 30; after a step of 8 sequences, a step of 3 padded to 4
    buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"), num_groups=2, scratch_state_slot=30)
    for _ in range(2):
        buffers.load([1] * 8, [-1] * 8, [6] * 8, [0.0] * 8, [[[3, 4], [5, 6]]] * 8, 8, state_slots=list(range(8)))
    ids, _, positions, slots, lens, _, _, order, tables, state_slots = buffers.load(
        [4, 5, 6],
        [-1] * 3,
        [1, 5, 2],
        [0.0] * 3,
        [[[7], [9]], [[10, 11], [12, 13]], [[14], [15]]],
        4,
        state_slots=[12, 3, 27],
    )
    assert state_slots.tolist() == [12, 3, 27, 30]
    # the other fields lie as without state
    assert ids.tolist() == [4, 5, 6, 0] and positions.tolist() == [1, 5, 2, 0] and lens.tolist() == [2, 6, 3, 0]
    assert slots.tolist() == [[7 * 4 + 1, 11 * 4 + 1, 14 * 4 + 2, -1], [9 * 4 + 1, 13 * 4 + 1, 15 * 4 + 2, -1]]
    assert order.tolist() == [1, 2, 0, 3]
    assert tables[:, :, :2].tolist() == [
        [[7, -1], [10, 11], [14, -1], [-1, -1]],
        [[9, -1], [12, 13], [15, -1], [-1, -1]],
    ]
    # the device view of this shape is where the copy put them
    assert buffers.views(4)[9].data_ptr() == state_slots.data_ptr()


def test_the_state_slots_take_a_word_per_sequence_and_nothing_without_state():
    stateless = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"))
    with_state = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"), scratch_state_slot=48)
    # per sequence: 7 per-query fields, seq_order and a table (a state slot too with state)
    assert stateless.device.numel() == 16 * (7 + 1 + WIDTH)
    assert with_state.device.numel() == stateless.device.numel() + 16
