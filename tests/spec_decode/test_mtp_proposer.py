"""The scheduler's side of method "mtp": the drafts the runner made beside a step are proposed at the next
step for the request at the length they follow, cut to the room it has, and let go with the request; the
scheduler names the next prompt token after a chunk short of its prompt's end and holds blocks k - 1
positions past each step for the further drafts."""

from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.core.scheduler_output import PLACEHOLDER
from nanovllm.spec_decode.mtp_proposer import MTPProposer
from nanovllm.spec_decode.speculative_config import SpeculativeConfig

from helpers.schedulers import BS, make_req, make_scheduler

K = 3


def test_drafts_are_proposed_at_the_length_they_follow_and_let_go_with_the_request():
    proposer = MTPProposer(K)
    proposer.receive("a", 5, [7, 8, 9])
    assert proposer.propose([[1] * 5, [1] * 5], [3, 2], ["a", "b"]) == [[7, 8, 9], []]
    assert proposer.propose([[1] * 5], [2], ["a"]) == [[7, 8]]
    assert proposer.propose([[1] * 6], [3], ["a"]) == [[]]  # tokens came since: the drafts follow no more
    proposer.release("a")
    assert proposer.propose([[1] * 5], [3], ["a"]) == [[]]


def test_chunks_name_the_next_prompt_token_and_steps_hold_blocks_for_the_further_drafts():
    scheduler = make_scheduler(max_num_batched_tokens=6, chunked=True, speculative=SpeculativeConfig("mtp", K))
    scheduler.proposer = MTPProposer(K)
    req = make_req("a", range(2, 2 + 2 * BS), temperature=0.0)  # two blocks of prompt: chunks of 6 and 2
    scheduler.add_request(req)
    out = scheduler.schedule()
    assert out.next_token_ids == [req.token_ids[6]] and out.samples == [False]
    assert len(req.block_tables[0]) == 2  # the prompt's (6 + K - 1 positions fit in them)
    scheduler.update(out, ModelRunnerOutput([]))
    out = scheduler.schedule()
    assert out.next_token_ids == [PLACEHOLDER] and out.samples == [True]
    # K - 1 positions past the prompt: a third block, for the drafts after the first
    assert len(req.block_tables[0]) == 3
    scheduler.update(out, ModelRunnerOutput([[20]], draft_token_ids=[[21, 22, 23]]))
    out = scheduler.schedule()
    assert out.draft_token_ids == [[21, 22, 23]]
