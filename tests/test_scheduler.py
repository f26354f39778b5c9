"""Scheduler: prefill-first batching (chunked prefill off) and chunked, mixed steps (on); token and
block budgets, decode with preemption, and postprocessing."""

from types import SimpleNamespace

import pytest

from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.sampling_params import SamplingParams

BS = 4
EOS = 1


def make_scheduler(num_blocks=16, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, chunked=False):
    config = SimpleNamespace(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=max_model_len, eos_token_ids=(EOS,),
                             num_kvcache_blocks=num_blocks, kvcache_block_size=BS, enable_chunked_prefill=chunked)
    return Scheduler(config)


def make_seq(token_ids, **params):
    params.setdefault("max_tokens", 100)
    return Sequence(list(token_ids), SamplingParams(**params), BS)


def add_all(sched, *seqs):
    for seq in seqs:
        sched.add(seq)
    return seqs


def step(sched, token=50):
    """One engine step with a fixed sampled token; returns the batch."""
    batch = sched.schedule()
    sched.postprocess(batch, [token] * len(batch.sampled_seqs))
    return batch


def test_prefill_runs_before_waiting_decodes():
    sched = make_scheduler()
    a = make_seq([10, 11, 12])
    sched.add(a)
    assert step(sched).seqs == [a]
    b = make_seq([20, 21])
    sched.add(b)
    batch = sched.schedule()
    assert batch.is_prefill and batch.seqs == [b]
    sched.postprocess(batch, [50])
    batch = sched.schedule()
    assert not batch.is_prefill and batch.seqs == [a, b]


def test_prefill_admits_in_order_within_max_num_seqs():
    sched = make_scheduler(max_num_seqs=2)
    a, b, c = add_all(sched, make_seq([2, 3]), make_seq([4, 5]), make_seq([6, 7]))
    batch = sched.schedule()
    assert batch.is_prefill and batch.seqs == [a, b]
    assert list(sched.waiting) == [c] and list(sched.running) == [a, b]
    assert a.status == b.status == SequenceStatus.RUNNING and c.status == SequenceStatus.WAITING
    sched.postprocess(batch, [50, 50])
    batch = sched.schedule()
    assert batch.is_prefill and batch.seqs == [c]


def test_token_budget_counts_only_uncached_tokens():
    prefix = list(range(2, 10))
    for budget, expected in ((12, 2), (11, 1)):
        sched = make_scheduler(max_num_batched_tokens=budget)
        a, b = add_all(sched, make_seq(prefix + [20, 21]), make_seq(prefix + [30, 31]))
        batch = sched.schedule()
        assert batch.seqs == [a, b][:expected]


def test_token_budget_admits_cached_follower_with_its_uncached_count():
    prefix = list(range(2, 10))
    sched = make_scheduler(max_num_batched_tokens=12)
    a, b = add_all(sched, make_seq(prefix + [20, 21]), make_seq(prefix + [30, 31]))
    assert sched.schedule().seqs == [a, b]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8


def test_token_budget_stops_admission_without_skipping():
    sched = make_scheduler(max_num_batched_tokens=10)
    a, b, c = add_all(sched, make_seq(range(2, 10)), make_seq(range(20, 28)), make_seq([30]))
    assert sched.schedule().seqs == [a]
    assert list(sched.waiting) == [b, c]


def test_admission_stops_when_blocks_run_out():
    sched = make_scheduler(num_blocks=3)
    a, b, c = add_all(sched, make_seq(range(2, 10)), make_seq(range(20, 28)), make_seq([30]))
    batch = sched.schedule()
    assert batch.seqs == [a]
    assert list(sched.waiting) == [b, c]
    assert b.block_table == [] and sched.block_manager.num_free_blocks == 1


def test_decode_takes_running_sequences_in_order():
    sched = make_scheduler()
    a, b, c = add_all(sched, make_seq([2]), make_seq([3]), make_seq([4]))
    step(sched)
    batch = sched.schedule()
    assert not batch.is_prefill and batch.seqs == [a, b, c]
    assert list(sched.running) == [a, b, c]


def test_decode_respects_max_num_seqs_and_keeps_running_order():
    sched = make_scheduler(max_num_seqs=2)
    a, b, c = add_all(sched, make_seq([2]), make_seq([3]), make_seq([4]))
    step(sched)
    step(sched)
    batch = sched.schedule()
    assert not batch.is_prefill and batch.seqs == [a, b]
    assert list(sched.running) == [a, b, c]


def test_decode_preempts_from_tail_when_a_block_is_missing():
    sched = make_scheduler(num_blocks=4)
    a, b, c, d = add_all(sched, make_seq([2, 3, 4, 5]), make_seq([6, 7]), make_seq([8, 9]), make_seq([10, 11]))
    step(sched)
    e = make_seq(range(20, 28))
    sched.add(e)
    batch = sched.schedule()
    assert not batch.is_prefill and batch.seqs == [a, b, c]
    assert list(sched.running) == [a, b, c]
    assert list(sched.waiting) == [d, e]
    assert d.status == SequenceStatus.WAITING
    assert d.block_table == [] and d.num_computed_tokens == 0
    assert d.token_ids == [10, 11, 50]
    assert len(a.block_table) == 2
    assert sched.block_manager.num_free_blocks == 0


def test_decode_preempts_itself_when_nothing_else_is_left():
    sched = make_scheduler(num_blocks=3)
    a, b = add_all(sched, make_seq([2, 3, 4, 5]), make_seq([6, 7, 8, 9]))
    step(sched)
    batch = sched.schedule()
    assert batch.seqs == [a]
    assert list(sched.running) == [a] and list(sched.waiting) == [b]
    assert b.status == SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert sched.block_manager.num_free_blocks == 1


def test_preempted_sequence_is_prefilled_again_with_its_completion():
    sched = make_scheduler(num_blocks=3)
    a, b = add_all(sched, make_seq([2, 3, 4, 5], max_tokens=2), make_seq([6, 7, 8, 9]))
    step(sched)
    assert step(sched).seqs == [a] and a.is_finished
    batch = sched.schedule()
    assert batch.is_prefill and batch.seqs == [b]
    assert b.num_tokens == 5 and b.num_cached_tokens == 4
    assert len(b.block_table) == 2


def test_postprocess_appends_token_and_marks_it_computed():
    sched = make_scheduler()
    a = make_seq([2, 3, 4, 5, 6, 7])
    sched.add(a)
    sched.postprocess(sched.schedule(), [42])
    assert a.token_ids[-1] == 42 and a.completion_token_ids == [42]
    assert a.num_tokens == 7 and a.num_computed_tokens == 6
    assert a.status == SequenceStatus.RUNNING and list(sched.running) == [a]


def test_postprocess_finishes_on_eos_and_frees_blocks():
    sched = make_scheduler(num_blocks=8)
    a, b = add_all(sched, make_seq([2, 3, 4, 5, 6]), make_seq([7, 8]))
    batch = sched.schedule()
    assert sched.block_manager.num_free_blocks == 5
    sched.postprocess(batch, [EOS, 42])
    assert a.is_finished and a.completion_token_ids == [EOS]
    assert a.block_table == []
    assert list(sched.running) == [b] and not b.is_finished
    assert sched.block_manager.num_free_blocks == 7


def test_postprocess_ignores_eos_when_asked():
    sched = make_scheduler()
    a = make_seq([2, 3], ignore_eos=True)
    sched.add(a)
    sched.postprocess(sched.schedule(), [EOS])
    assert not a.is_finished and list(sched.running) == [a]


def test_postprocess_finishes_at_max_tokens():
    sched = make_scheduler()
    a = make_seq([2, 3], max_tokens=2)
    sched.add(a)
    step(sched)
    assert not a.is_finished
    step(sched)
    assert a.is_finished and a.completion_token_ids == [50, 50]
    assert sched.is_finished() and sched.block_manager.num_free_blocks == 16


def test_postprocess_finishes_at_max_model_len():
    sched = make_scheduler(max_model_len=7)
    a = make_seq([2, 3, 4, 5, 6])
    sched.add(a)
    step(sched)
    assert not a.is_finished
    step(sched)
    assert a.is_finished and a.num_tokens == 7
    assert not sched.running


@pytest.mark.parametrize("chunked, budget", [(False, 16), (True, 5)])
def test_schedule_never_returns_empty_batch_while_work_remains(chunked, budget):
    sched = make_scheduler(num_blocks=6, max_num_seqs=3, max_num_batched_tokens=budget, max_model_len=32,
                           chunked=chunked)
    shared = [2, 3, 4, 5]
    prompts = [shared + [6, 7], shared + [8], [9, 10, 11], shared + [6, 7], [12] * 7]
    seqs = [make_seq(p, max_tokens=6 + i) for i, p in enumerate(prompts)]
    add_all(sched, *seqs)
    bm = sched.block_manager
    reprefills = cache_hits = partial_chunks = 0
    for n in range(500):
        if sched.is_finished():
            break
        batch = sched.schedule()
        assert batch.seqs and sum(batch.num_scheduled_tokens) <= budget
        if batch.is_prefill:
            reprefills += sum(1 for s in batch.seqs if s.num_completion_tokens and s.num_new_tokens > 1)
            cache_hits += sum(1 for s in batch.seqs if s.num_cached_tokens)
        partial_chunks += batch.samples.count(False)
        for seq, k in zip(batch.seqs, batch.num_scheduled_tokens):
            assert len(seq.block_table) == seq.num_blocks
            end = seq.num_computed_tokens + k
            if end % BS:  # a block left partly filled is never shared
                assert bm.blocks[seq.block_table[end // BS]].ref_count == 1
            # only blocks whose K/V is computed by the end of this step may be found by the prefix cache
            assert all(bm.blocks[b].hash == -1 for b in seq.block_table[end // BS:])
        refs = [0] * len(bm.blocks)
        for seq in sched.running:
            for b in seq.block_table:
                refs[b] += 1
        assert refs == [b.ref_count for b in bm.blocks]
        assert set(bm.free_block_ids) | bm.used_block_ids == set(range(6))
        sched.postprocess(batch, [(n * 7 + s.seq_id) % 40 + 2 for s in batch.sampled_seqs])
    assert sched.is_finished() and reprefills and cache_hits
    assert bool(partial_chunks) == chunked
    assert [s.num_completion_tokens for s in seqs] == [6, 7, 8, 9, 10]
    assert bm.num_free_blocks == 6 and not bm.used_block_ids


def test_abort_running_sequence_frees_its_blocks():
    sched = make_scheduler(num_blocks=8)
    a, b = add_all(sched, make_seq([2, 3, 4, 5, 6]), make_seq([7, 8]))
    step(sched)
    sched.abort(a)
    assert a.is_finished and a.block_table == []
    assert list(sched.running) == [b] and sched.block_manager.num_free_blocks == 7
    assert step(sched).seqs == [b]


def test_abort_waiting_sequence_leaves_the_queue():
    sched = make_scheduler(max_num_seqs=1)
    a, b = add_all(sched, make_seq([2, 3]), make_seq([4, 5]))
    step(sched)
    sched.abort(b)
    assert b.is_finished and not sched.waiting
    sched.abort(a)
    assert sched.is_finished() and sched.block_manager.num_free_blocks == 16


# ---- chunked prefill: mixed steps of decodes and prompt chunks ----


def chunked_scheduler(**kw):
    kw.setdefault("max_num_batched_tokens", 8)
    return make_scheduler(chunked=True, **kw)


def test_long_prompt_is_split_into_budget_sized_chunks_and_samples_once():
    sched = chunked_scheduler()
    a = make_seq(range(2, 22))  # 20 tokens, budget 8
    sched.add(a)
    for chunk, computed in ((8, 0), (8, 8), (4, 16)):
        batch = sched.schedule()
        assert batch.is_prefill and batch.seqs == [a] and batch.num_scheduled_tokens == [chunk]
        assert a.num_computed_tokens == computed and len(a.block_table) == 5
        assert batch.sampled_seqs == ([a] if chunk == 4 else [])
        sched.postprocess(batch, [50] * len(batch.sampled_seqs))
        assert a.num_completion_tokens == (1 if chunk == 4 else 0) and list(sched.running) == [a]
    assert a.num_computed_tokens == 20 and a.completion_token_ids == [50]
    batch = sched.schedule()
    assert not batch.is_prefill and batch.num_scheduled_tokens == [1]


def test_decodes_go_first_and_the_prompt_takes_the_rest_of_the_budget():
    sched = chunked_scheduler()
    a, b = add_all(sched, make_seq([2, 3]), make_seq([4, 5, 6]))
    first = step(sched)
    assert first.seqs == [a, b] and first.num_scheduled_tokens == [2, 3]
    c = make_seq(range(10, 30))
    sched.add(c)
    batch = step(sched)
    assert batch.is_prefill and batch.seqs == [a, b, c] and batch.num_scheduled_tokens == [1, 1, 6]
    assert a.num_completion_tokens == b.num_completion_tokens == 2 and c.num_completion_tokens == 0
    assert c.num_computed_tokens == 6
    batch = step(sched)
    assert batch.seqs == [a, b, c] and batch.num_scheduled_tokens == [1, 1, 6]
    assert c.num_computed_tokens == 12


def test_decode_only_step_takes_the_decode_path():
    sched = chunked_scheduler()
    a, b = add_all(sched, make_seq([2, 3]), make_seq([4, 5]))
    step(sched)
    batch = sched.schedule()
    assert not batch.is_prefill and batch.num_scheduled_tokens == [1, 1] and batch.samples == [True, True]


def test_partly_prefilled_prompt_keeps_its_place_before_later_requests():
    sched = chunked_scheduler()
    a = make_seq(range(2, 14))  # 12 tokens
    sched.add(a)
    step(sched)
    b = make_seq([40, 41, 42])
    sched.add(b)
    batch = step(sched)
    assert batch.seqs == [a, b] and batch.num_scheduled_tokens == [4, 3]
    assert batch.samples == [True, True] and list(sched.running) == [a, b]


def test_budget_caps_decodes_too():
    sched = chunked_scheduler(max_num_batched_tokens=2)
    a, b, c = add_all(sched, make_seq([2]), make_seq([3]), make_seq([4]))
    assert step(sched).seqs == [a, b]
    batch = sched.schedule()
    assert batch.seqs == [a, b] and batch.num_scheduled_tokens == [1, 1]
    assert list(sched.running) == [a, b] and list(sched.waiting) == [c]


def test_prefix_cache_offers_only_blocks_already_computed():
    sched = chunked_scheduler()
    prompt = list(range(2, 22))
    a = make_seq(prompt)
    sched.add(a)
    step(sched)  # tokens 0..7 computed: blocks 0 and 1 full
    assert [sched.block_manager.blocks[b].hash != -1 for b in a.block_table] == [True, True, False, False, False]
    b = make_seq(prompt)
    assert sched.block_manager.cached_prefix(b) == a.block_table[:2]


def test_preemption_in_the_middle_of_a_chunked_prefill_resumes_from_the_prefix_cache():
    sched = chunked_scheduler(num_blocks=6)
    a = make_seq([2, 3, 4])
    sched.add(a)
    step(sched)
    c = make_seq(range(10, 30))  # 20 tokens: 5 blocks, the rest of the pool
    sched.add(c)
    batch = step(sched)
    assert batch.seqs == [a, c] and batch.num_scheduled_tokens == [1, 7]
    assert sched.block_manager.num_free_blocks == 0 and c.num_computed_tokens == 7
    # a's next token opens a new block; only c can give it one
    batch = sched.schedule()
    assert batch.seqs == [a] and batch.num_scheduled_tokens == [1]
    assert list(sched.waiting) == [c] and c.status == SequenceStatus.WAITING
    assert c.block_table == [] and c.num_computed_tokens == 0 and c.num_completion_tokens == 0
    sched.postprocess(batch, [50])
    sched.abort(a)
    batch = sched.schedule()
    # its first block was full of computed tokens and comes back from the cache
    assert batch.seqs == [c] and c.num_cached_tokens == 4 and batch.num_scheduled_tokens == [8]
