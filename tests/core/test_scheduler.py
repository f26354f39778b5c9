"""Scheduler: prefill-first batching (chunked prefill off) and chunked, mixed steps (on); token and
block budgets, decode with preemption, updates with the sampled tokens, and the overlapped loop's
rules for tokens still in flight (step n+1 scheduled before step n is read back)."""

import pytest

from nanovllm.core.kv_cache_manager import chain_hash
from nanovllm.core.request import RequestStatus
from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.core.scheduler_output import PLACEHOLDER, PromptScoring
from nanovllm.engine.messages import EngineCoreOutput, EngineStats, TokenLogprobs

from helpers.schedulers import BS, EOS, block_hash, held_blocks, hit_blocks, make_req, make_scheduler


def add_all(sched, *reqs):
    for req in reqs:
        sched.add_request(req)
    return reqs


def step(sched, token=50):
    """One step read back at once (no overlap), every sampling request drawing `token`; returns the step."""
    out = sched.schedule()
    sched.update(out, ModelRunnerOutput([[token]] * len(out.sampled_req_ids)))
    return out


def read_back(sched, out, *tokens):
    """Update with the tokens a launched step sampled, one per sampling request; returns the outputs."""
    return sched.update(out, ModelRunnerOutput([[token] for token in tokens]))


def test_prefill_runs_before_waiting_decodes():
    sched = make_scheduler()
    sched.add_request(make_req("a", [10, 11, 12]))
    assert step(sched).req_ids == ["a"]
    sched.add_request(make_req("b", [20, 21]))
    out = step(sched)
    assert out.req_ids == ["b"] and out.token_ids == [[20, 21]]
    out = sched.schedule()
    assert out.is_decode and out.req_ids == ["a", "b"] and out.token_ids == [[50], [50]]


def test_prefill_admits_in_order_within_max_num_seqs():
    sched = make_scheduler(max_num_seqs=2)
    a, b, c = add_all(sched, make_req("a", [2, 3]), make_req("b", [4, 5]), make_req("c", [6, 7]))
    assert step(sched).req_ids == ["a", "b"]
    assert list(sched.waiting) == [c] and list(sched.running) == [a, b]
    assert a.status == b.status == RequestStatus.RUNNING and c.status == RequestStatus.WAITING
    out = sched.schedule()
    assert out.req_ids == ["c"] and out.token_ids == [[6, 7]]


@pytest.mark.parametrize("budget, admitted", [(12, ["a", "b"]), (11, ["a"])])
def test_token_budget_counts_only_uncached_tokens(budget, admitted):
    prefix = list(range(2, 10))
    sched = make_scheduler(max_num_batched_tokens=budget)
    add_all(sched, make_req("a", prefix + [20, 21]), make_req("b", prefix + [30, 31]))
    assert sched.schedule().req_ids == admitted


def test_cached_follower_computes_only_its_uncached_tokens():
    prefix = list(range(2, 10))
    sched = make_scheduler(max_num_batched_tokens=12)
    _, b = add_all(sched, make_req("a", prefix + [20, 21]), make_req("b", prefix + [30, 31]))
    out = sched.schedule()
    assert out.req_ids == ["a", "b"] and out.num_scheduled_tokens == [10, 2]
    assert out.num_computed_tokens == [0, 8] and out.token_ids[1] == [30, 31]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 10


def test_token_budget_stops_admission_without_skipping():
    sched = make_scheduler(max_num_batched_tokens=10)
    _, b, c = add_all(sched, make_req("a", range(2, 10)), make_req("b", range(20, 28)), make_req("c", [30]))
    assert sched.schedule().req_ids == ["a"]
    assert list(sched.waiting) == [b, c]


def test_admission_stops_when_blocks_run_out():
    sched = make_scheduler(num_blocks=3)
    _, b, c = add_all(sched, make_req("a", range(2, 10)), make_req("b", range(20, 28)), make_req("c", [30]))
    assert sched.schedule().req_ids == ["a"]
    assert list(sched.waiting) == [b, c]
    assert b.block_tables == [] and sched.kv_cache.num_free_blocks == 1


def test_decode_takes_running_requests_in_order():
    sched = make_scheduler()
    reqs = add_all(sched, make_req("a", [2]), make_req("b", [3]), make_req("c", [4]))
    step(sched)
    out = sched.schedule()
    assert out.is_decode and out.req_ids == ["a", "b", "c"]
    assert list(sched.running) == list(reqs)


def test_decode_respects_max_num_seqs_and_keeps_running_order():
    sched = make_scheduler(max_num_seqs=2)
    reqs = add_all(sched, make_req("a", [2]), make_req("b", [3]), make_req("c", [4]))
    step(sched)
    step(sched)
    out = sched.schedule()
    assert out.is_decode and out.req_ids == ["a", "b"]
    assert list(sched.running) == list(reqs)


def test_decode_preempts_from_tail_when_a_block_is_missing():
    sched = make_scheduler(num_blocks=4)
    a, b, c, d = add_all(
        sched, make_req("a", [2, 3, 4, 5]), make_req("b", [6, 7]), make_req("c", [8, 9]), make_req("d", [10, 11])
    )
    step(sched)
    e = make_req("e", range(20, 28))
    sched.add_request(e)
    out = sched.schedule()
    assert out.is_decode and out.req_ids == ["a", "b", "c"]
    assert list(sched.running) == [a, b, c] and list(sched.waiting) == [d, e]
    assert d.status == RequestStatus.WAITING
    assert d.block_tables == [] and d.num_computed_tokens == 0
    assert d.token_ids == [10, 11, 50] and d.num_placeholders == 0
    assert len(a.block_tables[0]) == 2 and sched.kv_cache.num_free_blocks == 0


def test_decode_preempts_itself_when_nothing_else_is_left():
    sched = make_scheduler(num_blocks=3)
    a, b = add_all(sched, make_req("a", [2, 3, 4, 5]), make_req("b", [6, 7, 8, 9]))
    step(sched)
    assert sched.schedule().req_ids == ["a"]
    assert list(sched.running) == [a] and list(sched.waiting) == [b]
    assert b.status == RequestStatus.WAITING and b.block_tables == [] and b.num_computed_tokens == 0
    assert sched.kv_cache.num_free_blocks == 1


def test_preempted_request_is_prefilled_again_with_its_completion():
    sched = make_scheduler(num_blocks=3)
    a, b = add_all(sched, make_req("a", [2, 3, 4, 5], max_tokens=2), make_req("b", [6, 7, 8, 9, 10]))
    step(sched)
    assert step(sched, token=60).req_ids == ["a"] and a.is_finished
    out = sched.schedule()
    assert out.req_ids == ["b"] and out.token_ids == [[10, 50]] and out.num_computed_tokens == [4]
    assert b.num_cached_tokens == 4 and len(b.block_tables[0]) == 2


def test_update_confirms_the_sampled_token():
    sched = make_scheduler()
    a = make_req("a", [2, 3, 4, 5, 6, 7])
    sched.add_request(a)
    out = sched.schedule()
    assert a.num_tokens == 7 and a.num_placeholders == 1 and a.token_ids == [2, 3, 4, 5, 6, 7]
    assert read_back(sched, out, 42) == [EngineCoreOutput("a", [42])]
    assert a.token_ids[-1] == 42 and a.num_placeholders == 0
    assert a.num_tokens == 7 and a.num_computed_tokens == 6
    assert a.status == RequestStatus.RUNNING and list(sched.running) == [a]


def test_update_reports_logprobs_and_cached_tokens_per_request():
    sched = make_scheduler()
    add_all(sched, make_req("a", [2, 3, 4, 5, 6]), make_req("b", [2, 3, 4, 5, 7]), make_req("c", [8]))
    # a drew its second most likely token; b asked for no logprobs; c for no alternatives
    a_logprobs, c_logprobs = TokenLogprobs([50, 9], [-1.5, -0.5], 2), TokenLogprobs([70], [-0.25], 1)
    result = ModelRunnerOutput([[50], [60], [70]], [[a_logprobs], None, [c_logprobs]])
    # b found the block [2, 3, 4, 5] that a registered when it was admitted just before
    assert sched.update(sched.schedule(), result) == [
        EngineCoreOutput("a", [50], [a_logprobs], num_cached_tokens=0),
        EngineCoreOutput("b", [60], None, num_cached_tokens=4),
        EngineCoreOutput("c", [70], [c_logprobs], num_cached_tokens=0),
    ]


def test_update_finishes_on_eos_and_frees_blocks():
    sched = make_scheduler(num_blocks=8)
    a, b = add_all(sched, make_req("a", [2, 3, 4, 5, 6]), make_req("b", [7, 8]))
    out = sched.schedule()
    assert sched.kv_cache.num_free_blocks == 5
    outputs = read_back(sched, out, EOS, 42)
    assert [o.finish_reason for o in outputs] == ["stop", None]
    assert a.is_finished and a.finish_reason == "stop" and a.token_ids[5:] == [EOS]
    assert a.block_tables == [] and "a" not in sched.requests
    assert list(sched.running) == [b] and not b.is_finished
    assert sched.kv_cache.num_free_blocks == 7


def test_update_ignores_eos_when_asked():
    sched = make_scheduler()
    a = make_req("a", [2, 3], ignore_eos=True)
    sched.add_request(a)
    assert read_back(sched, sched.schedule(), EOS) == [EngineCoreOutput("a", [EOS])]
    assert not a.is_finished and list(sched.running) == [a]


def test_update_finishes_at_max_tokens():
    sched = make_scheduler()
    a = make_req("a", [2, 3], max_tokens=2)
    sched.add_request(a)
    step(sched)
    assert not a.is_finished
    step(sched)
    assert a.finish_reason == "length" and a.token_ids[2:] == [50, 50]
    assert not sched.has_requests() and sched.kv_cache.num_free_blocks == 16


def test_update_finishes_at_max_model_len():
    sched = make_scheduler(max_model_len=7)
    a = make_req("a", [2, 3, 4, 5, 6])
    sched.add_request(a)
    step(sched)
    assert not a.is_finished
    step(sched)
    assert a.finish_reason == "length" and a.num_tokens == 7
    assert not sched.running


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("chunked, budget", [(False, 16), (True, 5)])
def test_mixed_load_keeps_blocks_consistent_and_finishes_every_request(chunked, budget, overlap):
    sched = make_scheduler(
        num_blocks=6, max_num_seqs=3, max_num_batched_tokens=budget, max_model_len=32, chunked=chunked
    )
    shared = [2, 3, 4, 5]
    prompts = [shared + [6, 7], shared + [8], [9, 10, 11], shared + [6, 7], [12] * 7]
    reqs = add_all(sched, *(make_req(str(i), p, max_tokens=6 + i) for i, p in enumerate(prompts)))
    bm = sched.kv_cache
    reprefills = cache_hits = partial_chunks = num_sampled = 0
    in_flight = None
    for n in range(500):
        if not sched.has_requests():
            break
        out = sched.schedule()
        assert out.req_ids or (in_flight and in_flight.req_ids), "no step scheduled and none in flight"
        assert sum(out.num_scheduled_tokens) <= budget
        partial_chunks += out.samples.count(False)
        num_sampled += len(out.sampled_req_ids)
        for req_id, ids, start, sampled in zip(out.req_ids, out.token_ids, out.num_computed_tokens, out.samples):
            req = sched.requests[req_id]
            end = start + len(ids)
            assert ids == req.token_ids[start:end] or (overlap and ids == [PLACEHOLDER])
            reprefills += len(ids) > 1 and end > req.num_prompt_tokens
            cache_hits += start > 0 and start == req.num_cached_tokens
            assert len(req.block_tables[0]) == (req.num_tokens - sampled + BS - 1) // BS
            if end % BS:
                assert bm.blocks[req.block_tables[0][end // BS]].ref_count == 1
            assert all(block_hash(bm, b) != -1 for b in req.block_tables[0][: min(end, len(req.token_ids)) // BS])
            assert all(block_hash(bm, b) == -1 for b in req.block_tables[0][end // BS :])
            for i, b in enumerate(req.block_tables[0]):
                if block_hash(bm, b) != -1:
                    assert bm.blocks[b].token_ids == req.token_ids[i * BS : (i + 1) * BS] and len(req.block(i)) == BS
        refs = [0] * len(bm.blocks)
        for req in sched.running:
            for b in req.block_tables[0]:
                refs[b] += 1
        assert refs == [b.ref_count for b in bm.blocks]
        assert sorted([*bm.free_block_ids, *held_blocks(bm)]) == list(range(6))
        to_read, in_flight = (in_flight, out) if overlap else (out, None)
        if to_read is not None:
            read_back(sched, to_read, *((n * 7 + int(r)) % 40 + 2 for r in to_read.sampled_req_ids))
    assert not sched.has_requests() and reprefills and cache_hits
    assert bool(partial_chunks) == chunked
    assert [len(r.token_ids) - r.num_prompt_tokens for r in reqs] == [6, 7, 8, 9, 10]
    assert all(r.finish_reason == "length" for r in reqs)
    assert num_sampled == 6 + 7 + 8 + 9 + 10
    assert bm.num_free_blocks == 6 and not held_blocks(bm)


def test_abort_running_request_frees_its_blocks():
    sched = make_scheduler(num_blocks=8)
    a, b = add_all(sched, make_req("a", [2, 3, 4, 5, 6]), make_req("b", [7, 8]))
    step(sched)
    sched.abort(["a"])
    assert a.finish_reason == "abort" and a.block_tables == [] and "a" not in sched.requests
    assert list(sched.running) == [b] and sched.kv_cache.num_free_blocks == 7
    assert step(sched).req_ids == ["b"]


def test_abort_waiting_request_leaves_the_queue():
    sched = make_scheduler(max_num_seqs=1)
    a, b = add_all(sched, make_req("a", [2, 3]), make_req("b", [4, 5]))
    step(sched)
    sched.abort(["b", "unknown"])
    assert b.finish_reason == "abort" and not sched.waiting and list(sched.running) == [a]
    sched.abort(["a"])
    assert not sched.has_requests() and sched.kv_cache.num_free_blocks == 16


# ---- chunked prefill: mixed steps of decodes and prompt chunks ----


def chunked_scheduler(**kw):
    kw.setdefault("max_num_batched_tokens", 8)
    return make_scheduler(chunked=True, **kw)


def test_long_prompt_is_split_into_budget_sized_chunks_and_samples_once():
    sched = chunked_scheduler()
    a = make_req("a", range(2, 22))
    sched.add_request(a)
    for chunk, computed in ((8, 0), (8, 8), (4, 16)):
        out = step(sched)
        assert out.req_ids == ["a"] and out.num_computed_tokens == [computed]
        assert out.token_ids == [list(range(2 + computed, 2 + computed + chunk))]
        assert a.num_computed_tokens == computed + chunk and len(a.block_tables[0]) == 5
        assert out.sampled_req_ids == (["a"] if chunk == 4 else [])
        assert a.num_output_tokens == (1 if chunk == 4 else 0) and list(sched.running) == [a]
    assert a.num_computed_tokens == 20 and a.token_ids[20:] == [50]
    out = sched.schedule()
    assert out.is_decode and out.token_ids == [[50]]


def test_decodes_go_first_and_the_prompt_takes_the_rest_of_the_budget():
    sched = chunked_scheduler()
    a, b = add_all(sched, make_req("a", [2, 3]), make_req("b", [4, 5, 6]))
    first = step(sched)
    assert first.req_ids == ["a", "b"] and first.num_scheduled_tokens == [2, 3]
    c = make_req("c", range(10, 30))
    sched.add_request(c)
    out = step(sched)
    assert out.req_ids == ["a", "b", "c"] and out.num_scheduled_tokens == [1, 1, 6]
    assert out.samples == [True, True, False]
    assert a.num_output_tokens == b.num_output_tokens == 2 and c.num_output_tokens == 0
    assert c.num_computed_tokens == 6
    out = step(sched)
    assert out.req_ids == ["a", "b", "c"] and out.num_scheduled_tokens == [1, 1, 6]
    assert c.num_computed_tokens == 12


def test_decode_only_step_takes_the_decode_path():
    sched = chunked_scheduler()
    add_all(sched, make_req("a", [2, 3]), make_req("b", [4, 5]))
    assert not step(sched).is_decode
    out = sched.schedule()
    assert out.is_decode and out.num_scheduled_tokens == [1, 1] and out.samples == [True, True]


def test_partly_prefilled_prompt_keeps_its_place_before_later_requests():
    sched = chunked_scheduler()
    a = make_req("a", range(2, 14))
    sched.add_request(a)
    step(sched)
    b = make_req("b", [40, 41, 42])
    sched.add_request(b)
    out = step(sched)
    assert out.req_ids == ["a", "b"] and out.num_scheduled_tokens == [4, 3]
    assert out.samples == [True, True] and list(sched.running) == [a, b]


def test_budget_caps_decodes_too():
    sched = chunked_scheduler(max_num_batched_tokens=2)
    a, b, c = add_all(sched, make_req("a", [2]), make_req("b", [3]), make_req("c", [4]))
    assert step(sched).req_ids == ["a", "b"]
    out = sched.schedule()
    assert out.req_ids == ["a", "b"] and out.num_scheduled_tokens == [1, 1]
    assert list(sched.running) == [a, b] and list(sched.waiting) == [c]


def test_prefix_cache_offers_only_blocks_already_computed():
    sched = chunked_scheduler()
    prompt = list(range(2, 22))
    a = make_req("a", prompt)
    sched.add_request(a)
    step(sched)
    assert [block_hash(sched.kv_cache, b) != -1 for b in a.block_tables[0]] == [True, True, False, False, False]
    assert hit_blocks(sched.kv_cache, make_req("b", prompt)) == a.block_tables[0][:2]


def test_preemption_in_the_middle_of_a_chunked_prefill_resumes_from_the_prefix_cache():
    sched = chunked_scheduler(num_blocks=6)
    a = make_req("a", [2, 3, 4])
    sched.add_request(a)
    step(sched)
    c = make_req("c", range(10, 30))
    sched.add_request(c)
    out = step(sched)
    assert out.req_ids == ["a", "c"] and out.num_scheduled_tokens == [1, 7]
    assert sched.kv_cache.num_free_blocks == 0 and c.num_computed_tokens == 7
    out = sched.schedule()
    assert out.req_ids == ["a"] and out.num_scheduled_tokens == [1]
    assert list(sched.waiting) == [c] and c.status == RequestStatus.WAITING
    assert c.block_tables == [] and c.num_computed_tokens == 0 and c.num_output_tokens == 0
    read_back(sched, out, 50)
    sched.abort(["a"])
    out = sched.schedule()
    assert out.req_ids == ["c"] and c.num_cached_tokens == 4
    assert out.num_computed_tokens == [4] and out.num_scheduled_tokens == [8]


# ---- the overlapped loop: step n+1 is scheduled before step n is read back ----


def test_next_step_decodes_a_placeholder_and_allocates_its_block():
    sched = make_scheduler()
    a = make_req("a", [2, 3, 4, 5])
    sched.add_request(a)
    first = sched.schedule()
    assert len(a.block_tables[0]) == 1
    second = sched.schedule()
    assert second.token_ids == [[PLACEHOLDER]] and second.num_computed_tokens == [4]
    assert second.num_output_tokens == [1] and second.samples == [True]
    assert a.num_tokens == 6 and a.num_placeholders == 2 and a.token_ids == [2, 3, 4, 5]
    assert len(a.block_tables[0]) == 2 and sched.kv_cache.num_free_blocks == 14
    read_back(sched, first, 50)
    read_back(sched, second, 51)
    assert a.token_ids == [2, 3, 4, 5, 50, 51] and a.num_placeholders == 0 and a.num_tokens == 6


def test_block_is_hashed_only_once_its_last_token_is_confirmed():
    sched = make_scheduler()
    a = make_req("a", [2, 3, 4])
    sched.add_request(a)
    bm = sched.kv_cache
    follower = make_req("f", [2, 3, 4, 50, 9])
    first = sched.schedule()
    sched.schedule()
    block = a.block_tables[0][0]
    assert a.num_computed_tokens == 4 and block_hash(bm, block) == -1
    read_back(sched, first, 50)
    assert block_hash(bm, block) == -1 and hit_blocks(bm, follower) == []
    sched.schedule()
    assert block_hash(bm, block) == chain_hash([2, 3, 4, 50]) and hit_blocks(bm, follower) == [block]


def test_token_sampled_after_a_stop_is_dropped():
    sched = make_scheduler(num_blocks=8)
    a, b = add_all(sched, make_req("a", [2, 3, 4, 5, 6]), make_req("b", [7, 8]))
    bm = sched.kv_cache
    first = sched.schedule()
    second = sched.schedule()
    assert second.req_ids == ["a", "b"]
    assert [o.finish_reason for o in read_back(sched, first, EOS, 42)] == ["stop", None]
    assert a.block_tables == [] and bm.num_free_blocks == 7
    assert sched.schedule().req_ids == ["b"]
    assert read_back(sched, second, 60, 61) == [EngineCoreOutput("b", [61])]
    assert a.token_ids == [2, 3, 4, 5, 6, EOS] and b.token_ids == [7, 8, 42, 61]
    assert sorted(bm.free_block_ids) == sorted(set(range(8)) - set(b.block_tables[0]))
    assert held_blocks(bm) == set(b.block_tables[0])


@pytest.mark.parametrize("max_tokens, max_model_len", [(2, 64), (100, 4)])
def test_request_with_its_last_token_in_flight_is_not_scheduled(max_tokens, max_model_len):
    sched = make_scheduler(max_model_len=max_model_len)
    a, b = add_all(sched, make_req("a", [2, 3], max_tokens=max_tokens), make_req("b", [4]))
    first = sched.schedule()
    second = sched.schedule()
    assert second.req_ids == ["a", "b"]
    read_back(sched, first, 50, 60)
    assert sched.schedule().req_ids == ["b"] and list(sched.running) == [a, b]
    outputs = read_back(sched, second, 51, 61)
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("a", "length"), ("b", None)]
    assert a.token_ids == [2, 3, 50, 51] and list(sched.running) == [b]


def test_step_is_empty_while_the_only_request_waits_for_its_last_token():
    sched = make_scheduler()
    sched.add_request(make_req("a", [2, 3], max_tokens=1))
    first = sched.schedule()
    assert sched.schedule().is_empty and sched.has_requests()
    assert read_back(sched, first, 50) == [EngineCoreOutput("a", [50], finish_reason="length")]
    assert not sched.has_requests() and sched.kv_cache.num_free_blocks == 16


def test_preempted_request_is_readmitted_only_once_its_token_is_confirmed():
    # b's second block holds the same tokens as a's, so once a registers it b's re-admission
    # would find both its full blocks in use and fit in the block that its preemption freed.
    sched = make_scheduler(num_blocks=4, chunked=True)
    a, b = add_all(sched, make_req("a", [2, 3, 4, 5, 6, 7, 8]), make_req("b", [2, 3, 4, 5, 6, 7, 8, 50]))
    bm = sched.kv_cache
    first = sched.schedule()
    second = sched.schedule()
    read_back(sched, first, 50, 60)
    assert sched.schedule().req_ids == ["a"]
    assert list(sched.waiting) == [b] and b.block_tables == [] and b.num_placeholders == 1
    hit = bm.cached_prefix(b)
    assert hit.tables == [a.block_tables[0][:2]] and bm.can_allocate(b, hit, b.num_tokens)
    read_back(sched, second, 51, 61)
    out = sched.schedule()
    assert out.req_ids == ["a", "b"] and out.token_ids == [[PLACEHOLDER], [60, 61]]
    assert out.num_computed_tokens == [9, 8] and b.num_cached_tokens == 8


def test_token_of_an_aborted_request_is_dropped():
    sched = make_scheduler(num_blocks=8)
    a, _ = add_all(sched, make_req("a", [2, 3, 4, 5, 6]), make_req("b", [7, 8]))
    first = sched.schedule()
    sched.abort(["a"])
    assert a.finish_reason == "abort" and sched.kv_cache.num_free_blocks == 7
    assert sched.schedule().req_ids == ["b"]
    assert read_back(sched, first, 50, 60) == [EngineCoreOutput("b", [60])]
    assert a.token_ids == [2, 3, 4, 5, 6]


def test_needs_confirmed_tokens_only_for_penalties_with_a_token_in_flight():
    sched = make_scheduler()
    sched.add_request(make_req("a", [2, 3]))
    first = sched.schedule()
    assert not sched.needs_confirmed_tokens()
    sched.add_request(make_req("p", [4, 5], repetition_penalty=1.2))
    assert not sched.needs_confirmed_tokens()
    read_back(sched, first, 50)
    second = sched.schedule()
    assert second.req_ids == ["p"] and sched.needs_confirmed_tokens()
    read_back(sched, second, 60)
    assert not sched.needs_confirmed_tokens()


def test_penalty_steps_carry_every_sampling_request_prompt_and_completion():
    sched = make_scheduler()
    add_all(sched, make_req("a", [2, 3]), make_req("p", [4, 5], repetition_penalty=1.2))
    first = step(sched)
    assert first.penalty_token_ids == [([2, 3], []), ([4, 5], [])]
    read_back(sched, sched.schedule(), 51, 61)
    assert step(sched).penalty_token_ids == [([2, 3], [50, 51]), ([4, 5], [50, 61])]
    sched.abort(["p"])
    assert step(sched).penalty_token_ids is None


# ---- stop reasons, prompt logprobs and counters ----


def test_stop_reason_is_the_stop_token_id_and_none_for_eos():
    sched = make_scheduler()
    add_all(
        sched,
        make_req("a", [2, 3], stop_token_ids=[9]),
        make_req("b", [4, 5], stop_token_ids=[9]),
        make_req("c", [6, 7], stop_token_ids=[9], min_tokens=2),
    )
    outputs = read_back(sched, sched.schedule(), 9, EOS, 9)
    # c's stop token comes before its min_tokens: it goes on, with no reason
    assert [(o.request_id, o.finish_reason, o.stop_reason) for o in outputs] == [
        ("a", "stop", 9),
        ("b", "stop", None),
        ("c", None, None),
    ]


def test_a_request_with_prompt_logprobs_gets_no_prefix_cache_hit():
    sched = make_scheduler()
    prompt = list(range(2, 11))  # two full blocks and one token
    sched.add_request(make_req("a", prompt))
    step(sched)
    scored, plain = add_all(sched, make_req("scored", prompt, prompt_logprobs=0), make_req("plain", prompt))
    assert hit_blocks(sched.kv_cache, scored) != []  # its prefix is there to take
    out = sched.schedule()
    # every prompt position's logits are needed: "scored" computes all 9 tokens, "plain" only the last
    assert out.req_ids == ["scored", "plain"] and out.num_computed_tokens == [0, 8]
    assert (scored.num_cached_tokens, plain.num_cached_tokens) == (0, 8)


def test_prompt_chunks_score_the_positions_before_each_next_prompt_token_once():
    sched = chunked_scheduler(max_num_batched_tokens=5)
    sched.add_request(make_req("d", [2]))
    step(sched)
    prompt = list(range(10, 20))
    sched.add_request(make_req("a", prompt, prompt_logprobs=2))
    # d's decode goes first each step; a's prompt comes in chunks of 4, 4 and 2 at batch index 1. The last
    # prompt position samples the first completion token, so it is not scored.
    scorings = [step(sched).prompt_scoring for _ in range(3)]
    assert scorings == [
        [PromptScoring("a", 1, 0, 2, prompt[1:5])],
        [PromptScoring("a", 1, 0, 2, prompt[5:9])],
        [PromptScoring("a", 1, 0, 2, prompt[9:])],
    ]
    assert step(sched).prompt_scoring == []  # decodes score nothing


def test_a_recompute_after_preemption_scores_no_prompt_position_twice():
    # as in the chunked-prefill preemption above: c is preempted after a first chunk of 7 tokens
    sched = chunked_scheduler(num_blocks=6)
    a = make_req("a", [2, 3, 4])
    sched.add_request(a)
    step(sched)
    prompt = list(range(10, 30))
    c = make_req("c", prompt, prompt_logprobs=1)
    sched.add_request(c)
    out = step(sched)
    assert out.num_scheduled_tokens == [1, 7] and out.prompt_scoring == [PromptScoring("c", 1, 0, 1, prompt[1:8])]
    out = sched.schedule()
    assert out.req_ids == ["a"] and list(sched.waiting) == [c] and out.prompt_scoring == []
    read_back(sched, out, 50)
    sched.abort(["a"])
    # the recompute starts again at position 0, nothing coming from the cache, but scores from position 7 on
    out = step(sched)
    assert out.num_computed_tokens == [0] and out.num_scheduled_tokens == [8]
    assert out.prompt_scoring == [PromptScoring("c", 0, 7, 1, [prompt[8]])]
    targets = [prompt[8]]
    while not out.samples[0]:
        out = step(sched)
        targets += [t for scoring in out.prompt_scoring for t in scoring.target_ids]
    assert prompt[1:8] + targets == prompt[1:]


def test_update_reports_the_prompt_logprobs_of_a_chunk_that_samples_nothing_without_a_token():
    sched = chunked_scheduler(max_num_batched_tokens=4)
    sched.add_request(make_req("d", [2]))
    step(sched)
    sched.add_request(make_req("a", [10, 11, 12, 13, 14], prompt_logprobs=0))
    # d decodes; a's first chunk [10, 11, 12] scores the positions before 11, 12 and 13 and samples nothing
    out = sched.schedule()
    assert out.sampled_req_ids == ["d"]
    first = [TokenLogprobs([11], [-1.0], 2), TokenLogprobs([12], [-0.5], 1), TokenLogprobs([13], [-2.0], 5)]
    assert sched.update(out, ModelRunnerOutput([[60]], None, {"a": first})) == [
        EngineCoreOutput("d", [60]),
        EngineCoreOutput("a", [], new_prompt_logprobs=first),
    ]
    # a's last chunk [13, 14] scores the position before 14 and samples: both come in one output
    out = sched.schedule()
    assert out.sampled_req_ids == ["d", "a"]
    last = [TokenLogprobs([14], [-0.25], 1)]
    assert sched.update(out, ModelRunnerOutput([[61], [70]], None, {"a": last})) == [
        EngineCoreOutput("d", [61]),
        EngineCoreOutput("a", [70], new_prompt_logprobs=last),
    ]


def test_stats_count_prefix_cache_queries_and_hits_and_preemptions():
    sched = make_scheduler(num_blocks=4)
    _, b = add_all(sched, make_req("a", [2, 3, 4, 5, 6]), make_req("b", [2, 3, 4, 5, 7]))
    step(sched)
    # both prompts were looked up, 5 tokens each; b found a's first block
    assert sched.stats() == EngineStats(
        num_running=2,
        num_waiting=0,
        kv_cache_usage=0.75,
        prefix_cache_queries=10,
        prefix_cache_hits=4,
        num_preemptions=0,
    )
    # three decodes bring each to 9 tokens; the fourth needs a third block each, and one is left
    for _ in range(3):
        step(sched)
    assert step(sched).req_ids == ["a"] and list(sched.waiting) == [b]
    assert sched.stats() == EngineStats(
        num_running=1,
        num_waiting=1,
        kv_cache_usage=0.75,
        prefix_cache_queries=10,
        prefix_cache_hits=4,
        num_preemptions=1,
    )
    # b's recompute looks up its 9 tokens and finds both its full blocks still cached
    sched.abort(["a"])
    out = sched.schedule()
    assert out.req_ids == ["b"] and out.num_computed_tokens == [8]
    stats = sched.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_preemptions) == (19, 12, 1)


def test_a_request_that_skips_the_prefix_cache_is_no_query():
    sched = make_scheduler()
    prompt = list(range(2, 11))
    sched.add_request(make_req("a", prompt))
    step(sched)
    sched.add_request(make_req("s", prompt, prompt_logprobs=0))
    sched.schedule()
    assert (sched.stats().prefix_cache_queries, sched.stats().prefix_cache_hits) == (9, 0)


def test_without_prefix_caching_a_repeated_prompt_is_computed_again_and_no_query_is_counted():
    sched = make_scheduler(prefix_caching=False)
    prompt = list(range(2, 11))
    sched.add_request(make_req("a", prompt))
    step(sched)
    sched.add_request(make_req("b", prompt))
    out = sched.schedule()
    assert out.req_ids == ["b"] and out.num_computed_tokens == [0] and out.token_ids == [prompt]
    assert (sched.stats().prefix_cache_queries, sched.stats().prefix_cache_hits) == (0, 0)


def run_to_completion(sched, reqs):
    """Add `reqs` and run steps (each read back at once) until every request finished; the most requests
    that ran at once."""
    add_all(sched, *reqs)
    most = 0
    while sched.has_requests():
        step(sched)
        most = max(most, len(sched.running))
    return most


def outgrowing_requests():
    # 5 prompts of 2 blocks that share none, each writing 8 blocks more: 50 blocks in all, 40 in the pool
    return [make_req(name, range(2 + 10 * i, 10 + 10 * i), max_tokens=32) for i, name in enumerate("abcde")]


def test_admission_keeps_room_for_the_running_requests_to_decode():
    sched = make_scheduler(num_blocks=40, max_model_len=64, conservativeness=1.0)
    reqs = add_all(sched, *outgrowing_requests())
    # each request is expected to end with 40 tokens (10 blocks): 3 start (the bound on their peak counts up to
    # a block more each for part-full last blocks); a fourth joins once they near their ends, none is preempted
    assert step(sched).req_ids == ["a", "b", "c"]
    assert run_to_completion(sched, []) == 4
    assert sched.num_preemptions == 0 and all(req.num_output_tokens == 32 for req in reqs)
    assert sched.num_preemptions == 0
    assert sched.kv_cache.num_free_blocks == 40


def test_admission_while_prompts_fit_preempts_as_requests_outgrow_the_pool():
    sched = make_scheduler(num_blocks=40, max_model_len=64, conservativeness=0.0)
    assert run_to_completion(sched, outgrowing_requests()) == 5
    assert sched.num_preemptions > 0


def test_admission_counts_that_requests_end_at_different_times():
    # a ends after 4 more tokens, b after 36: b's growth takes the blocks a gives back
    sched = make_scheduler(num_blocks=16, max_model_len=64, conservativeness=1.0)
    a, b = add_all(sched, make_req("a", range(2, 22), max_tokens=4), make_req("b", range(30, 34), max_tokens=36))
    assert step(sched).req_ids == ["a", "b"]
    assert run_to_completion(sched, []) == 2
    assert sched.num_preemptions == 0


def test_a_lone_request_is_admitted_whatever_it_is_expected_to_write():
    # expected to reach 64 tokens (16 blocks) once its 40 tokens of output are written; others wait meanwhile
    sched = make_scheduler(conservativeness=1.0)
    a, b = add_all(sched, make_req("a", range(2, 26), max_tokens=40), make_req("b", [3, 4]))
    assert step(sched).req_ids == ["a"]
    assert list(sched.waiting) == [b]
    assert run_to_completion(sched, []) == 1
    assert sched.num_preemptions == 0


def test_admission_learns_that_requests_stop_early():
    sched = make_scheduler(num_blocks=64, max_model_len=256, conservativeness=1.0)
    # requests allowed 100 tokens that stop at their second: the estimate comes down to a few tokens each
    for i in range(100):
        sched.add_request(make_req(f"warm{i}", [5, 6, 7, 8], max_tokens=100))
        out = step(sched)
        sched.update(sched.schedule(), ModelRunnerOutput([[EOS]] * len(sched.running)))
        assert out.req_ids == [f"warm{i}"] and not sched.has_requests()
    assert sched.output_estimate.share < 0.1
    add_all(sched, *[make_req(f"r{i}", range(2, 6), max_tokens=100) for i in range(8)])
    # 8 one-block prompts expected to write a few blocks each fit the 64 blocks where 8 x 26 would not
    assert len(step(sched).req_ids) == 8
