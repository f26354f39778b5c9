"""State slots for recurrent layers, through the scheduler: two slots per running request where there are
enough, else one (a live state without a snapshot), a snapshot at each block boundary a step ends on,
snapshots cached when requests end and restored on a prefix hit, least recently used ones evicted, every slot
back when requests end."""

from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, RecurrentState
from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.core.state_slots import ZERO_STATE

from helpers.schedulers import make_req, make_scheduler

RECURRENT = RecurrentState(((2, 3),), ("float32",))
# three recurrent layers to one of full attention, as Qwen3.5 alternates them
HYBRID = cache_layout((RECURRENT, RECURRENT, RECURRENT, FullAttention(1, 8)))


def hybrid_scheduler(num_state_slots=8, **kwargs):
    return make_scheduler(layout=HYBRID, num_state_slots=num_state_slots, chunked=True, **kwargs)


def step(sched, token=50):
    out = sched.schedule()
    sched.update(out, ModelRunnerOutput([[token]] * len(out.sampled_req_ids)))
    return out


def all_slots_back(sched):
    states = sched.kv_cache.states
    return sorted(states.free_slots + [s.slot for s in states.cached.values()]) == list(range(states.num_slots))


def test_a_request_takes_two_slots_and_starts_from_zeros():
    sched = hybrid_scheduler()
    a = make_req("a", range(2, 5))
    sched.add_request(a)
    out = sched.schedule()
    assert out.state_slots == [a.state_slot] and a.state_slot != a.snapshot_slot
    assert out.state_restores == [(ZERO_STATE, a.state_slot)] and out.state_snapshots == []
    assert len(sched.kv_cache.states.free_slots) == 6


def test_a_prompt_chunk_stops_at_the_last_block_boundary_it_crosses_and_snapshots_there():
    sched = hybrid_scheduler()
    a = make_req("a", range(2, 12))  # 10 tokens: blocks end at 4 and 8
    sched.add_request(a)
    out = step(sched)
    assert out.token_ids == [list(range(2, 10))] and out.samples == [False]
    # the prompt's last block ends there: its state is also cached at once, in a slot of its own
    (cached,) = sched.kv_cache.states.cached.values()
    assert out.state_snapshots == [(a.state_slot, a.snapshot_slot), (a.state_slot, cached.slot)]
    assert a.snapshot_tokens == 8 and cached.last_block == list(range(6, 10))
    out = step(sched)
    assert out.token_ids == [[10, 11]] and out.samples == [True] and out.state_snapshots == []


def test_decode_snapshots_each_block_boundary_it_reaches():
    sched = hybrid_scheduler()
    a = make_req("a", range(2, 5))  # 3 tokens
    sched.add_request(a)
    snapshots = []
    for _ in range(6):
        out = step(sched)
        snapshots.append((out.num_computed_tokens[0] + len(out.token_ids[0]), out.state_snapshots))
    assert [end for end, copies in snapshots if copies] == [4, 8]
    assert a.snapshot_tokens == 8


def test_a_finished_requests_snapshot_serves_the_next_turn():
    sched = hybrid_scheduler()
    first = make_req("a", range(2, 9), max_tokens=4)  # 7 prompt tokens + 4: a snapshot after 8
    sched.add_request(first)
    while sched.has_requests():
        step(sched, token=60)
    # the state where the prompt's last block ends (4) was cached at once, the last snapshot (8) at the end
    assert all_slots_back(sched) and len(sched.kv_cache.states.cached) == 2
    cached = next(s for s in sched.kv_cache.states.cached.values() if s.last_block == first.token_ids[4:8])
    second = make_req("b", first.token_ids + [70, 71, 72, 73, 74])
    sched.add_request(second)
    out = sched.schedule()
    assert second.num_cached_tokens == 8 and out.num_computed_tokens == [8]
    assert out.state_restores == [(cached.slot, second.state_slot)]
    assert cached.slot not in (second.state_slot, second.snapshot_slot)


def test_a_hit_ends_at_the_last_snapshot_even_where_more_blocks_are_cached():
    sched = hybrid_scheduler()
    prompt = list(range(2, 19))  # 17 tokens: the prompt snapshots after 16
    first = make_req("a", prompt, max_tokens=1)
    sched.add_request(first)
    while sched.has_requests():
        step(sched)
    states = sched.kv_cache.states
    assert [s.last_block for s in states.cached.values()] == [prompt[12:16]]
    states.cached.clear()  # as if evicted: the full-attention blocks are still cached
    states.free_slots = list(range(states.num_slots))
    second = make_req("b", prompt + [99])
    sched.add_request(second)
    out = sched.schedule()
    assert second.num_cached_tokens == 0 and out.state_restores == [(ZERO_STATE, second.state_slot)]


def test_a_preempted_request_resumes_from_its_own_snapshot():
    sched = hybrid_scheduler()
    a = make_req("a", range(2, 8))  # 6 tokens
    sched.add_request(a)
    for _ in range(4):
        step(sched)  # 8, then 9 tokens computed; snapshot after 8
    assert a.snapshot_tokens == 8
    sched._preempt(sched.running.pop())
    assert all_slots_back(sched)
    out = sched.schedule()
    assert a.num_cached_tokens == 8 and out.num_computed_tokens == [8]
    (restore,) = out.state_restores
    assert restore[0] != ZERO_STATE and restore[1] == a.state_slot


def test_cached_snapshots_give_their_slots_to_new_requests_oldest_first():
    sched = hybrid_scheduler(num_state_slots=5)
    for name, first in (("a", 2), ("b", 30), ("c", 50)):
        sched.add_request(make_req(name, range(first, first + 9), max_tokens=1))
        while sched.has_requests():
            step(sched)
    states = sched.kv_cache.states
    assert len(states.cached) == 3 and len(states.free_slots) == 2
    newest = list(states.cached)[-1]
    sched.add_request(make_req("d", range(70, 73)))
    sched.schedule()
    assert len(states.cached) == 3 and not states.free_slots
    sched.add_request(make_req("e", range(80, 83)))
    sched.schedule()
    assert list(states.cached) == [newest]


def test_a_request_waits_while_no_slot_is_free():
    sched = hybrid_scheduler(num_state_slots=1)
    sched.add_request(make_req("a", range(2, 5)))
    sched.add_request(make_req("b", range(10, 13)))
    out = sched.schedule()
    assert out.req_ids == ["a"] and [r.request_id for r in sched.waiting] == ["b"]
    sched.abort(["a"])
    assert sched.schedule().req_ids == ["b"]
    sched.abort(["b"])
    assert all_slots_back(sched)


def test_as_many_requests_run_as_there_are_slots_the_last_ones_without_snapshots():
    sched = hybrid_scheduler(num_state_slots=3)
    a, b, c = make_req("a", range(2, 5)), make_req("b", range(10, 13)), make_req("c", range(20, 23))
    for req in (a, b, c):
        sched.add_request(req)
    out = step(sched)
    assert out.req_ids == ["a", "b", "c"]
    # a took two slots, b the last free one, and c a's snapshot slot
    assert sorted(r.state_slot for r in (a, b, c)) == [0, 1, 2]
    assert a.snapshot_slot == b.snapshot_slot == -1
    sched.abort(["b", "c"])
    out = step(sched)  # a reaches its first block boundary: it takes a freed slot for its snapshot
    assert out.state_snapshots == [(a.state_slot, a.snapshot_slot)] and a.snapshot_tokens == 4
    sched.abort(["a"])
    assert all_slots_back(sched) and len(sched.kv_cache.states.cached) == 1


def test_a_snapshot_slot_taken_by_a_new_request_is_not_copied_into_that_step():
    sched = hybrid_scheduler(num_state_slots=2)
    a = make_req("a", range(2, 5))  # 3 tokens: its next step ends on the first block boundary
    sched.add_request(a)
    step(sched)
    taken = a.snapshot_slot
    b = make_req("b", range(10, 13))
    sched.add_request(b)
    out = step(sched)
    assert out.req_ids == ["a", "b"] and b.state_slot == taken
    assert out.state_snapshots == [] and a.snapshot_slot == -1 and a.snapshot_tokens == 0
    assert out.state_restores == [(ZERO_STATE, taken)]
    sched.abort(["a", "b"])
    assert all_slots_back(sched) and not sched.kv_cache.states.cached


def test_without_prefix_caching_no_chunk_is_cut_nothing_is_snapshotted_and_a_request_takes_one_slot():
    sched = hybrid_scheduler(prefix_caching=False)
    a = make_req("a", range(2, 12))
    sched.add_request(a)
    out = step(sched)
    assert out.token_ids == [list(range(2, 12))] and out.state_snapshots == []
    assert a.snapshot_slot == -1 and len(sched.kv_cache.states.free_slots) == 7
    for _ in range(4):
        assert step(sched).state_snapshots == []
    sched.abort(["a"])
    assert not sched.kv_cache.states.cached and all_slots_back(sched)


def test_no_snapshot_is_taken_past_drafts_still_in_flight():
    sched = hybrid_scheduler()
    a = make_req("a", range(2, 10))  # 8 tokens
    sched.add_request(a)
    step(sched)  # 8 computed, the 9th (50) confirmed
    manager = sched.kv_cache
    # a step in flight computes the 9th token, checks two drafts after it and samples one more
    a.add_drafts([60, 61])
    a.add_placeholder()
    a.pass_drafts_in_flight()
    # the next step is scheduled as if both drafts are kept; had it ended on a boundary, the state there
    # would be of fewer tokens once a draft is rejected
    assert a.num_placeholders == 3 and not manager._snapshot_due(a, 12)
    a.drop_rejected(2)
    a.confirm(70)
    assert a.num_placeholders == 0 and manager._snapshot_due(a, 12)


SHARED = list(range(2, 11))  # 9 tokens that several prompts start with: two whole blocks of 4


def finish(sched, prompt, name):
    req = make_req(name, prompt, max_tokens=1)
    sched.add_request(req)
    while sched.has_requests():
        step(sched)
    return req


def test_where_requests_share_kv_blocks_past_any_snapshot_the_state_there_is_cached_for_the_next_ones():
    sched = hybrid_scheduler()
    finish(sched, SHARED + [100, 101, 102], "a")  # its states cached after 12 tokens only
    b = make_req("b", SHARED + [200, 201, 202])
    sched.add_request(b)
    out = step(sched)
    # the cache holds b's first two blocks but no state after them: b computes them first, and that state is cached
    assert out.num_computed_tokens == [0] and out.token_ids == [SHARED[:8]] and b.branch_tokens == 8
    at_branch = next(s for s in sched.kv_cache.states.cached.values() if s.last_block == SHARED[4:8])
    assert (b.state_slot, at_branch.slot) in out.state_snapshots
    c = make_req("c", SHARED + [300, 301, 302])
    sched.add_request(c)
    out = step(sched)
    assert c.num_cached_tokens == 8 and (at_branch.slot, c.state_slot) in out.state_restores


def test_a_request_that_shares_the_blocks_whose_state_a_step_caches_waits_a_step_for_it():
    sched = hybrid_scheduler()
    finish(sched, SHARED + [100, 101, 102], "a")
    b, c = make_req("b", SHARED + [200, 201, 202]), make_req("c", SHARED + [300, 301, 302])
    sched.add_request(b)
    sched.add_request(c)
    out = step(sched)
    # c's restore would run before the forward pass that computes b's state there: it waits for the next step
    assert out.req_ids == ["b"] and out.token_ids == [SHARED[:8]] and [r.request_id for r in sched.waiting] == ["c"]
    out = step(sched)
    assert c.num_cached_tokens == 8 and out.req_ids == ["b", "c"]
