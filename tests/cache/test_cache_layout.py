"""Cache layout: the paged layers cut into cache groups that share one pool of equal blocks, the recurrent
layers' state groups, and what a sequence holds in each."""

from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, RecurrentState, SharedKV, SlidingWindow

BS = 4
WINDOW = 8
FULL, SLIDING = FullAttention(2, 8), SlidingWindow(2, 8, WINDOW)
ALTERNATING = cache_layout((SLIDING, FULL) * 2)


def test_layout_cuts_each_spec_into_groups_of_the_smallest_ones_size():
    specs = (SLIDING,) * 5 + (FULL,) + (SLIDING,) * 5 + (FULL,) + (SLIDING,) * 3
    layout = cache_layout(specs)
    assert layout.page_width == 2 * 2 * 8  # the full spec's two layers
    assert [(g.window, g.layers) for g in layout.groups] == [
        (WINDOW, (0, 1)),
        (WINDOW, (2, 3)),
        (WINDOW, (4, 6)),
        (WINDOW, (7, 8)),
        (WINDOW, (9, 10)),
        (WINDOW, (12, 13)),
        (WINDOW, (14,)),
        (None, (5, 11)),
    ]
    assert layout.group_of(11) == (7, 1) and layout.group_of(6) == (2, 1)
    everything = cache_layout(specs, full_attention_only=True)
    assert everything.page_width == 15 * 2 * 8 and [g.window for g in everything.groups] == [None]


def test_layout_skips_recurrent_and_shared_layers():
    recurrent = RecurrentState(((4, 3),), (None,))
    layout = cache_layout((recurrent, recurrent, recurrent, FULL, SharedKV(3)) * 2)
    assert [g.layers for g in layout.groups] == [(3, 8)]
    assert [(g.spec, g.layers) for g in layout.state_groups] == [(recurrent, (0, 1, 2, 5, 6, 7))]
    assert layout.has_state and not ALTERNATING.has_state


def test_layers_of_two_kv_shapes_keep_their_groups_and_list_both_shapes():
    # Gemma 4's shape: sliding layers of many narrow heads, a global one of few wide heads
    wide = FullAttention(1, 16)
    layout = cache_layout((SLIDING,) * 5 + (wide,))
    assert [(g.spec, g.layers) for g in layout.groups] == [
        (SLIDING, (0,)),
        *[(SLIDING, (i,)) for i in range(1, 5)],
        (wide, (5,)),
    ]
    assert layout.shapes == ((2, 8), (1, 16))
    # every token kept: one full-attention spec per shape, each shape's layers only in its own groups
    everything = cache_layout((SLIDING, SLIDING, wide, SLIDING, wide), full_attention_only=True)
    assert [(g.spec, g.layers) for g in everything.groups] == [(FULL, (0, 1)), (FULL, (3,)), (wide, (2, 4))]


def test_a_block_holds_as_many_narrow_layers_as_fill_the_room_of_the_wide_ones():
    # Gemma-4-31B's kinds: 50 sliding layers of 16 heads of 256, 10 global ones of 4 heads of 512, five
    # sliding to one global: a block holds the 10 global layers, or 5 sliding ones
    sliding, wide = SlidingWindow(16, 256, 1024), FullAttention(4, 512)
    layout = cache_layout(((sliding,) * 5 + (wide,)) * 10)
    assert layout.page_width == 10 * 4 * 512
    assert [len(g.layers) for g in layout.groups] == [5] * 10 + [10]
    assert layout.groups[-1].layers == tuple(range(5, 60, 6))
    # a layer wider than the smallest spec's layers together sets the room: one a block
    few_narrow = cache_layout((FullAttention(1, 8),) * 2 + (SlidingWindow(4, 16, 8),) * 3)
    assert few_narrow.page_width == 4 * 16
    assert [g.layers for g in few_narrow.groups] == [(0, 1), (2,), (3,), (4,)]


def test_blocks_held_by_a_long_sequence_are_bounded_by_the_window_in_sliding_groups():
    # Gemma 3's shape: 5 sliding layers of window 1024 to 1 full one, 34 layers
    specs = ((SlidingWindow(4, 256, 1024),) * 5 + (FullAttention(4, 256),)) * 6
    hybrid, full = cache_layout(specs[:34]), cache_layout(specs[:34], full_attention_only=True)
    tokens = 32768
    hybrid_bytes = hybrid.blocks_held(tokens, 16, 0) * hybrid.page_width
    full_bytes = full.blocks_held(tokens, 16, 0) * full.page_width
    assert full_bytes / hybrid_bytes > 5.5
    assert hybrid.groups[0].blocks_held(tokens, 16, 0) == 1024 // 16 + 1
    assert hybrid.groups[0].blocks_held(tokens, 16, 3, chunk=512) == (1024 - 1 + 3 + 512 + 15) // 16 + 1


def test_longest_request_is_the_most_tokens_whose_blocks_fit():
    for num_blocks in (2, 7, 30):
        n = ALTERNATING.longest_request(num_blocks, BS, 0, 1, 1000)
        assert ALTERNATING.blocks_held(n, BS, 0) <= num_blocks < ALTERNATING.blocks_held(n + 1, BS, 0)
