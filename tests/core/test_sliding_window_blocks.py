"""KVCacheManager over several cache groups: sliding-window groups give back the blocks their window has left,
prefix hits need only the window's blocks there, and every block comes back when requests end."""

from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, SlidingWindow
from nanovllm.core.kv_cache_manager import NO_BLOCK, KVCacheManager
from nanovllm.core.request import Request
from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.sampling_params import SamplingParams

from helpers.schedulers import held_blocks, make_scheduler

BS = 4
WINDOW = 8
FULL, SLIDING = FullAttention(2, 8), SlidingWindow(2, 8, WINDOW)
# Gemma 2's pattern: sliding and full layers alternate
ALTERNATING = cache_layout((SLIDING, FULL) * 2)


def make_req(request_id, token_ids):
    return Request(request_id, list(token_ids), SamplingParams(max_tokens=100), BS)


def admit(manager, req):
    hit = manager.cached_prefix(req)
    assert manager.can_allocate(req, hit, req.num_tokens)
    manager.allocate(req, hit, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    return hit


def decode(manager, req, token):
    """One decode step: the last token computed and `token` confirmed after it."""
    req.add_placeholder()
    req.confirm(token)
    assert manager.can_append(req, req.num_tokens)
    manager.may_append(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens


def held(table):
    return [b for b in table if b != NO_BLOCK]


def test_sliding_group_gives_back_the_blocks_its_window_left():
    manager = KVCacheManager(ALTERNATING, 32, BS)
    req = make_req("a", range(2, 8))  # 6 tokens
    admit(manager, req)
    for token in range(100, 130):
        decode(manager, req, token)
        sliding, full = req.block_tables
        # the next step's query at position num_tokens - 1 reads the last WINDOW positions
        first_read = max(0, req.num_tokens - 1 - WINDOW + 1) // BS
        assert all(b == NO_BLOCK for b in sliding[:first_read]) and held(sliding) == sliding[first_read:]
        assert len(held(full)) == (req.num_tokens + BS - 1) // BS
    assert manager.num_free_blocks == 32 - len(held(req.block_tables[0])) - len(req.block_tables[1])
    manager.deallocate(req)
    assert manager.num_free_blocks == 32 and not held_blocks(manager)


def test_lookback_keeps_that_many_more_positions():
    manager = KVCacheManager(ALTERNATING, 32, BS, lookback=3)
    req = make_req("a", range(2, 22))  # 20 tokens
    admit(manager, req)
    decode(manager, req, 50)  # the next query sits at position 20 and may move back to 17
    first_kept = (20 - WINDOW + 1 - 3) // BS
    assert held(req.block_tables[0]) == req.block_tables[0][first_kept:]


def test_prefix_hit_needs_only_the_windows_blocks_in_a_sliding_group():
    manager = KVCacheManager(ALTERNATING, 64, BS)
    prompt = list(range(2, 30))  # 28 tokens: 7 blocks
    first = make_req("a", prompt)
    admit(manager, first)
    manager.deallocate(first)
    second = make_req("b", prompt + [99])
    hit = admit(manager, second)
    assert hit.num_tokens == 28
    sliding, full = hit.tables
    assert held(full) == full and len(full) == 7
    # the first computed query, at position 28, reads positions 21..28: blocks 5 and 6 of the prefix
    assert sliding[:5] == [NO_BLOCK] * 5 and held(sliding) == sliding[5:]


def test_prefix_hit_ends_where_a_sliding_group_misses_a_block_of_its_window():
    manager = KVCacheManager(ALTERNATING, 64, BS)
    prompt = list(range(2, 30))
    first = make_req("a", prompt)
    admit(manager, first)
    sliding_block_6 = first.block_tables[0][6]
    manager.deallocate(first)
    del manager.cached_blocks[manager.blocks[sliding_block_6].key]  # as if evicted from the sliding group only
    hit = manager.cached_prefix(make_req("b", prompt + [99]))
    # ending at block 6 needs blocks 4 and 5 of the window (positions 17..24), which are there
    assert hit.num_tokens == 24 and len(hit.tables[1]) == 6
    assert hit.tables[0][:4] == [NO_BLOCK] * 4 and NO_BLOCK not in hit.tables[0][4:]


def test_a_preempted_sliding_request_resumes_from_its_cached_window():
    sched = make_scheduler(num_blocks=14, max_model_len=64, layout=ALTERNATING)
    a = make_req("a", range(2, 12))  # 10 tokens
    sched.add_request(a)
    for token in range(100, 110):
        out = sched.schedule()
        sched.update(out, ModelRunnerOutput([[token]] * len(out.sampled_req_ids)))
    assert held(a.block_tables[0]) != a.block_tables[0]  # the sliding group gave blocks back
    sched._preempt(sched.running.pop())
    assert sched.kv_cache.num_free_blocks == 14
    out = sched.schedule()
    # the full group still holds every block, the sliding one the last window's: a hit of all full blocks
    assert out.req_ids == ["a"] and a.num_cached_tokens == 16 and out.num_computed_tokens == [16]
    sched.update(out, ModelRunnerOutput([[7]]))
    sched.abort(["a"])
    assert sched.kv_cache.num_free_blocks == 14 and not held_blocks(sched.kv_cache)


def test_many_sliding_requests_fit_where_full_attention_would_preempt():
    def run(layout, num_blocks):
        sched = make_scheduler(num_blocks=num_blocks, max_model_len=64, layout=layout)
        for i in range(3):
            sched.add_request(make_req(str(i), range(2 + i, 10 + i)))
        for _ in range(13):
            out = sched.schedule()
            sched.update(out, ModelRunnerOutput([[50]] * len(out.sampled_req_ids)))
        return sched.num_preemptions, [len(req.token_ids) for req in sched.requests.values()]

    # the same memory: 26 blocks of 2 layers, or 13 blocks of all 4 layers
    assert run(ALTERNATING, 26) == (0, [21, 21, 21])
    assert run(cache_layout((SLIDING, FULL) * 2, full_attention_only=True), 13)[0] > 0


def test_peak_counts_a_sliding_groups_blocks_only_up_to_its_window():
    manager = KVCacheManager(ALTERNATING, 64, BS)
    # one request of 8 tokens growing to 100 in 92 steps: the full group ends at 25 blocks, the sliding group
    # at the 3 blocks a window of 8 spans at most
    assert manager.peak_blocks([(8, 100, 92)]) == 25 + 3
    # short of its window a sliding group holds what a full group does
    assert manager.peak_blocks([(2, 6, 4), (3, 7, 4)]) == 4 + 4
    full_only = KVCacheManager(cache_layout((SLIDING, FULL) * 2, full_attention_only=True), 64, BS)
    assert full_only.peak_blocks([(8, 100, 92)]) == 25


def test_peak_is_just_before_a_request_ends():
    manager = KVCacheManager(cache_layout((FULL,) * 2), 64, BS)
    # a: 40 tokens ending in 4 steps; b: 4 tokens ending in 36 steps. Just before a ends they hold 44 + 8
    # tokens, just before b ends 40 tokens: the peak is the first, in 4-token blocks rounded up each
    assert manager.peak_blocks([(40, 44, 4), (4, 40, 36)]) == (52 + 2 * 3) // 4
    assert manager.peak_blocks([]) == 0
