"""Scheduling with drafts: a request's last token and its drafts in one chunk, with blocks for them, within
max_tokens, the model length, the token budget and the free blocks; the kept tokens confirmed and the
rest rolled back, never registered in the prefix cache; a stop inside a kept run ends the request there."""

from nanovllm.core.kv_cache_manager import chain_hash
from nanovllm.core.request import RequestStatus
from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.core.scheduler_output import PLACEHOLDER
from nanovllm.spec_decode.proposer import Proposer

from helpers.schedulers import EOS, block_hash, make_req, make_scheduler

DRAFTS = [60, 61, 62]


class FixedProposer(Proposer):
    """Proposes `DRAFTS` (as many as fit) for every request, and records the contexts it was asked about and
    the requests released."""

    num_speculative_tokens = len(DRAFTS)

    def __init__(self):
        self.asked = []
        self.released = []

    def propose(self, token_ids, max_drafts, request_ids):
        self.asked += [list(ids) for ids in token_ids]
        return [DRAFTS[:k] for k in max_drafts]

    def release(self, request_id):
        self.released.append(request_id)


def drafting_scheduler(**kwargs):
    sched = make_scheduler(**kwargs)
    sched.proposer = FixedProposer()
    return sched


def prefilled(sched, req, first_token=50):
    """Admit `req` and read its prefill step back with `first_token`."""
    sched.add_request(req)
    out = sched.schedule()
    sched.update(out, ModelRunnerOutput([[first_token]] * len(out.sampled_req_ids)))
    return req


def test_the_last_token_and_its_drafts_run_as_one_chunk_with_blocks_for_them():
    sched = drafting_scheduler()
    a = prefilled(sched, make_req("a", [10, 11, 12]))
    out = sched.schedule()
    assert out.token_ids == [[50, *DRAFTS]] and out.num_computed_tokens == [3]
    assert out.draft_token_ids == [DRAFTS] and out.samples == [True]
    # the first token drawn is the second of the completion, whatever the drafts
    assert out.num_output_tokens == [1]
    # the last token, three drafts and the token sampled after them
    assert a.num_tokens == 8 and a.num_placeholders == 4 and a.num_computed_tokens == 7
    assert len(a.block_tables[0]) == 2
    assert sched.proposer.asked == [[10, 11, 12, 50]]


def test_kept_drafts_are_confirmed_and_the_rest_rolled_back_unregistered():
    sched = drafting_scheduler()
    a = prefilled(sched, make_req("a", [10, 11, 12]))
    bm = sched.kv_cache
    out = sched.schedule()
    # 60 kept, 61 rejected: 70 was sampled in its place
    [output] = sched.update(out, ModelRunnerOutput([[60, 70]]))
    assert output.new_token_ids == [60, 70] and output.finish_reason is None
    assert a.token_ids == [10, 11, 12, 50, 60, 70] and a.num_tokens == 6 and a.num_placeholders == 0
    # positions 0-4 hold the right K/V; 70's position (where 61's K/V went) is computed again next step
    assert a.num_computed_tokens == 5 and a.draft_token_ids == []
    assert block_hash(bm, a.block_tables[0][0]) == chain_hash([10, 11, 12, 50])
    assert block_hash(bm, a.block_tables[0][1]) == -1
    out = sched.schedule()
    assert out.token_ids == [[70, *DRAFTS]] and out.num_computed_tokens == [5]
    assert len(a.block_tables[0]) == 3
    sched.update(out, ModelRunnerOutput([[60, 61, 62, 63]]))
    assert a.token_ids[-5:] == [70, 60, 61, 62, 63] and a.num_computed_tokens == 9
    assert block_hash(bm, a.block_tables[0][1]) == -1  # [60, 70, 60, 61]: confirmed, registered once computed
    sched.schedule()
    assert block_hash(bm, a.block_tables[0][1]) == chain_hash([60, 70, 60, 61], chain_hash([10, 11, 12, 50]))
    stats = sched.stats()
    assert (stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens) == (2, 6)
    assert stats.spec_decode_num_accepted_tokens == 4
    assert stats.spec_decode_num_accepted_tokens_per_pos == [2, 1, 1]
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (2, 6, 4)
    assert a.speculation_summary() == "4 of 6 drafts kept (67%), 3.00 tokens a step"


def test_drafts_stay_within_max_tokens_the_model_length_and_the_token_budget():
    sched = drafting_scheduler()
    a = prefilled(sched, make_req("a", [10, 11, 12], max_tokens=3))
    # one token so far (blocks of 4 tokens): two more allowed, the last of them sampled after the drafts
    assert sched.schedule().draft_token_ids == [DRAFTS[:1]]
    assert a.num_output_tokens == 3
    sched = drafting_scheduler(max_model_len=6)
    b = prefilled(sched, make_req("b", [10, 11, 12]))
    assert sched.schedule().draft_token_ids == [DRAFTS[:1]]
    assert b.num_tokens == 6
    sched = drafting_scheduler(max_num_batched_tokens=6, chunked=True)
    sched.add_request(make_req("c", [10, 11]))
    prefilled(sched, make_req("d", [20, 21]))
    out = sched.schedule()
    assert out.draft_token_ids == [DRAFTS, DRAFTS[:1]] and sum(out.num_scheduled_tokens) == 6


def test_drafts_take_only_free_blocks_and_never_preempt():
    sched = drafting_scheduler(num_blocks=3)
    a = prefilled(sched, make_req("a", [10, 11, 12]))
    b = prefilled(sched, make_req("b", [20, 21, 22, 23, 24]))
    # a holds one block, b two: no block is free, so a drafts nothing, and b only within its second block
    out = sched.schedule()
    assert out.draft_token_ids == [[], DRAFTS[:2]]
    assert sched.num_preemptions == 0 and len(a.block_tables[0]) == 1 and len(b.block_tables[0]) == 2


def test_drafts_leave_the_blocks_later_requests_need_for_their_own_tokens():
    sched = drafting_scheduler(num_blocks=3)
    a, b = make_req("a", [10, 11, 12]), make_req("b", [20, 21, 22, 23])
    sched.add_request(a)
    sched.add_request(b)
    sched.update(sched.schedule(), ModelRunnerOutput([[50], [50]]))
    # one block is free, and b needs it for its fifth token: a may not draft into it, b drafts within it
    out = sched.schedule()
    assert out.draft_token_ids == [[], DRAFTS] and out.req_ids == ["a", "b"]
    assert sched.num_preemptions == 0 and len(b.block_tables[0]) == 2


def test_a_request_that_preempts_itself_leaves_without_drafts():
    sched = make_scheduler(num_blocks=3)
    b, a = make_req("b", [20, 21, 22]), make_req("a", [10, 11, 12])
    sched.add_request(b)
    sched.add_request(a)
    for token in (50, 51):
        sched.update(sched.schedule(), ModelRunnerOutput([[token], [token]]))
    # each holds one block and needs a second for its fifth token; one is free, and b comes first
    sched.proposer = FixedProposer()
    out = sched.schedule()
    assert out.req_ids == ["b"] and out.draft_token_ids == [DRAFTS]
    assert a.status == RequestStatus.WAITING and sched.num_preemptions == 1
    assert (a.num_tokens, a.num_placeholders, a.draft_token_ids) == (5, 0, [])
    assert sched.proposer.released == ["a"]


def test_the_proposer_is_told_when_a_request_finishes_or_is_aborted():
    sched = drafting_scheduler()
    prefilled(sched, make_req("a", [10, 11, 12], max_tokens=1))
    assert sched.proposer.released == ["a"]
    prefilled(sched, make_req("b", [20, 21]))
    sched.add_request(make_req("c", [30]))
    sched.abort(["b", "c"])
    assert sched.proposer.released == ["a", "b", "c"]


def test_requests_that_read_their_tokens_one_at_a_time_get_no_drafts_and_force_a_read_back():
    sched = drafting_scheduler()
    penalised = prefilled(sched, make_req("p", [10, 11, 12], repetition_penalty=1.2))
    scored = prefilled(sched, make_req("s", [20, 21, 22], prompt_logprobs=1))
    assert sched.schedule().draft_token_ids is None and sched.proposer.asked == []
    assert penalised.num_placeholders == scored.num_placeholders == 1
    plain = make_req("q", [30, 31])
    sched.add_request(plain)
    sched.schedule()
    # the plain request's token is in flight: the proposer needs it on the host
    assert plain.num_placeholders == 1 and sched.needs_confirmed_tokens()


def test_a_stop_inside_a_kept_run_ends_the_request_there():
    sched = drafting_scheduler()
    a = prefilled(sched, make_req("a", [10, 11, 12]))
    out = sched.schedule()
    [output] = sched.update(out, ModelRunnerOutput([[60, EOS, 62]]))
    assert output.new_token_ids == [60, EOS] and output.finish_reason == "stop"
    assert a.is_finished and sched.kv_cache.num_free_blocks == 16


def test_max_tokens_reached_inside_a_run_ends_it_with_length():
    sched = drafting_scheduler()
    prefilled(sched, make_req("a", [10, 11, 12], max_tokens=4, ignore_eos=True))
    out = sched.schedule()
    assert out.draft_token_ids == [DRAFTS[:2]]
    [output] = sched.update(out, ModelRunnerOutput([[60, 61, 80]]))
    assert output.new_token_ids == [60, 61, 80] and output.finish_reason == "length"


class AheadProposer(FixedProposer):
    """FixedProposer, proposing ahead of a token in flight (as the n-gram lookup does)."""

    proposes_ahead = True


def test_a_proposer_that_proposes_ahead_drafts_behind_the_token_in_flight():
    sched = make_scheduler()
    sched.proposer = AheadProposer()
    a = make_req("a", [10, 11, 12])
    sched.add_request(a)
    prefill = sched.schedule()
    # the prefill's token is in flight and nothing drafts yet: the next step need not wait for it
    assert not sched.needs_confirmed_tokens()
    out = sched.schedule()
    # asked from the confirmed tokens for one guess more, the first standing for the token in flight
    assert sched.proposer.asked == [[10, 11, 12]]
    assert out.token_ids == [[PLACEHOLDER, 61, 62]] and out.draft_token_ids == [[61, 62]]
    assert out.num_computed_tokens == [3] and out.num_output_tokens == [1]
    # drafts in flight: how many are kept decides where the request's next step starts, so it sits the next
    # step out (here nothing else runs: the step is empty, and the engine reads the one in flight back)
    assert not sched.needs_confirmed_tokens()
    assert sched.schedule().is_empty
    sched.update(prefill, ModelRunnerOutput([[50]]))
    # 61 kept, 62 rejected: 80 was sampled in its place
    [output] = sched.update(out, ModelRunnerOutput([[61, 80]]))
    assert output.new_token_ids == [61, 80]
    assert a.token_ids == [10, 11, 12, 50, 61, 80] and a.num_placeholders == 0 and a.num_computed_tokens == 5
    assert sched.schedule().token_ids == [[80, 60, 61, 62]]


def test_a_proposer_that_cannot_propose_ahead_waits_for_the_token_in_flight():
    sched = drafting_scheduler()
    sched.add_request(make_req("a", [10, 11, 12]))
    sched.schedule()
    assert sched.needs_confirmed_tokens()


def test_a_request_preempted_with_drafts_in_flight_keeps_what_they_confirm_and_recomputes_it():
    sched = make_scheduler(num_blocks=3)

    class OnlyA(AheadProposer):
        def propose(self, token_ids, max_drafts, request_ids):
            return [DRAFTS[:k] if r == "a" else [] for r, k in zip(request_ids, max_drafts)]

    sched.proposer = OnlyA()
    b, a = make_req("b", [20, 21, 22]), make_req("a", [10, 11, 12])
    sched.add_request(b)
    sched.add_request(a)
    sched.update(sched.schedule(), ModelRunnerOutput([[50], [50]]))
    with_drafts = sched.schedule()
    assert with_drafts.draft_token_ids == [[], DRAFTS]
    # a sits out with its drafts in flight; b needs a block for its next token and a, last, gives its own up
    b_alone = sched.schedule()
    assert b_alone.req_ids == ["b"] and a.status == RequestStatus.WAITING and sched.num_preemptions == 1
    # 60 kept, 61 rejected (70 drawn): a keeps both, forgets the rest, and recomputes what the cache lacks
    sched.update(with_drafts, ModelRunnerOutput([[51], [60, 70]]))
    assert a.token_ids == [10, 11, 12, 50, 60, 70] and (a.num_placeholders, a.draft_token_ids) == (0, [])
    sched.update(b_alone, ModelRunnerOutput([[52]]))
    sched.abort(["b"])
    out = sched.schedule()
    # its first block (confirmed tokens) comes from the prefix cache
    assert out.req_ids == ["a"] and out.token_ids == [[60, 70]] and out.num_computed_tokens == [4]


def ahead_scheduler(**kwargs):
    """A scheduler whose device runs ahead of the host: requests pass their drafts in flight."""
    sched = make_scheduler(**kwargs)
    sched.proposer = AheadProposer()
    sched.verify_ahead = True
    return sched


def test_a_request_passes_its_drafts_in_flight_and_moves_back_by_those_rejected():
    sched = ahead_scheduler()
    a = make_req("a", [10, 11, 12])
    sched.add_request(a)
    prefill = sched.schedule()
    first = sched.schedule()
    assert first.token_ids == [[PLACEHOLDER, 61, 62]]
    sched.update(prefill, ModelRunnerOutput([[50]]))
    # 61 and 62 in flight: the next step runs as if both will be kept, its drafts guessed on from them
    second = sched.schedule()
    assert sched.proposer.asked[-1] == [10, 11, 12, 50, 61, 62]
    assert second.token_ids == [[PLACEHOLDER, 61, 62]] and second.num_computed_tokens == [6]
    assert second.num_output_tokens == [4]
    # the first check keeps 61 and rejects 62 (80 drawn in its place): what the second step computes moves
    # back a position, as the device moved it (80 at position 5, the second step's drafts at 6 and 7)
    sched.update(first, ModelRunnerOutput([[61, 80]]))
    assert a.token_ids == [10, 11, 12, 50, 61, 80] and a.draft_token_ids == [61, 62]
    assert (a.num_computed_tokens, a.first_draft_position, a.num_tokens, a.num_placeholders) == (8, 6, 9, 3)
    third = sched.schedule()
    assert third.token_ids == [[PLACEHOLDER, 61, 62]] and third.num_computed_tokens == [8]
    # the second check rejects both drafts: the third step's tokens move back two positions
    sched.update(second, ModelRunnerOutput([[77]]))
    assert a.token_ids == [10, 11, 12, 50, 61, 80, 77]
    assert (a.num_computed_tokens, a.first_draft_position, a.num_tokens, a.num_placeholders) == (9, 7, 10, 3)
    # the third keeps both and the token after them; nothing was scheduled past it
    sched.update(third, ModelRunnerOutput([[61, 62, 90]]))
    assert a.token_ids == [10, 11, 12, 50, 61, 80, 77, 61, 62, 90]
    assert (a.num_computed_tokens, a.num_tokens, a.num_placeholders, a.draft_token_ids) == (9, 10, 0, [])
    assert sched.schedule().token_ids == [[90, 60, 61, 62]]


def test_drafts_in_flight_are_passed_only_in_decode_steps_of_requests_whose_draws_ignore_their_length():
    sched = ahead_scheduler(chunked=True)
    a, seeded = make_req("a", [10, 11, 12]), make_req("s", [20, 21, 22], seed=3, temperature=1.0)
    for req in (a, seeded):
        sched.add_request(req)
    sched.update(sched.schedule(), ModelRunnerOutput([[50], [51]]))
    assert sched.schedule().draft_token_ids == [DRAFTS, DRAFTS]
    # a waiting prompt would make the step a prefill step: every request with drafts in flight sits it out
    sched.add_request(make_req("w", [30, 31]))
    out = sched.schedule()
    assert out.req_ids == ["w"] and out.num_scheduled_tokens == [2]
    # with nothing waiting a passes its drafts; the seeded request, whose noise follows its length, sits out
    out = sched.schedule()
    assert out.req_ids == ["a", "w"] and out.token_ids[0][0] == PLACEHOLDER and out.draft_token_ids[0] == [61, 62]
    # a prompt that arrives now makes the next step a prefill step again, which a and w (drafts in flight) sit out
    sched.add_request(make_req("w3", [41, 42]))
    assert sched.schedule().req_ids == ["w3"]


def test_a_request_whose_drafts_are_all_rejected_pauses_its_proposals_longer_each_time_in_a_row():
    sched = drafting_scheduler(max_model_len=256, num_blocks=64)
    sched.pause_fruitless_drafts = True  # the GPU's choice
    a = prefilled(sched, make_req("a", [10, 11, 12], max_tokens=200))
    drafted = []
    for kept in [0, None, 0, None, None, None, 1, 0, None, 2]:
        out = sched.schedule()
        drafted.append(bool(out.draft_token_ids))
        drafts = out.draft_token_ids[0] if out.draft_token_ids else []
        assert (kept is None) == (not drafts)
        sched.update(out, ModelRunnerOutput([drafts[: kept or 0] + [70]]))
    # one step without drafts after the first fruitless one, three after the second in a row; a kept draft
    # resets the count, so the next fruitless step pauses one step again
    assert drafted == [True, False, True, False, False, False, True, True, False, True]
    assert a.num_fruitless_drafts == 0 and a.draft_pause == 0
    sched.pause_fruitless_drafts = False
    sched.update(out := sched.schedule(), ModelRunnerOutput([[70]]))
    assert out.draft_token_ids and sched.schedule().draft_token_ids


def test_no_request_drafts_while_more_run_than_the_drafting_batch_limit():
    sched = drafting_scheduler()
    sched.drafting_batch_limit = 1
    prefilled(sched, make_req("a", [10, 11, 12]))
    prefilled(sched, make_req("b", [20, 21, 22]))
    out = sched.schedule()
    assert out.draft_token_ids is None and out.req_ids == ["a", "b"]
    sched.update(out, ModelRunnerOutput([[70], [71]]))
    sched.abort(["b"])
    assert sched.schedule().draft_token_ids == [DRAFTS]
