"""Speculative decoding end to end on the CPU: with n-gram proposals, and with test proposers that are
always right or always wrong, every request's output is token for token what it is without speculation
(greedy, and seeded sampling), through prefix hits, preemption, stop tokens and strings, max_tokens and
requests that may not speculate in the same batch."""

import random

import pytest
import torch

from nanovllm import SamplingParams
from nanovllm.core.scheduler_output import PLACEHOLDER
from nanovllm.sampling_params import StructuredOutputsParams
from nanovllm.spec_decode.proposer import Proposer

from helpers.engine_probes import BLOCK, acceptance, engine, record_preemptions
from helpers.graphs_replayed_eagerly import GraphsReplayedEagerly
from helpers.prompts import repetitive_prompts, token_ids

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


class ReferenceProposer(Proposer):
    """Proposes what a reference run (prompt then completion) continued with, or with `wrong`, a token that
    differs from it at every position."""

    def __init__(self, sequences: list[list[int]], num_speculative_tokens: int = 3, wrong: bool = False):
        self.sequences = sequences
        self.num_speculative_tokens = num_speculative_tokens
        self.wrong = wrong

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        proposals = []
        for ids, k in zip(token_ids, max_drafts):
            # the first that continues `ids` (before a token in flight, a prompt may begin another's sequence
            # too: the guesses are then another request's, which verification rejects)
            sequence = next(s for s in self.sequences if s[: len(ids)] == ids)
            drafts = sequence[len(ids) : len(ids) + k]
            proposals.append([2 + (t - 1) % 510 for t in drafts] if self.wrong else drafts)
        return proposals


def spec_engine(model_dir, proposer: Proposer | None = None, **kwargs):
    """A tiny engine with n-gram speculation, its proposer replaced by `proposer` when given."""
    llm = engine(model_dir, speculative_config=NGRAM, **kwargs)
    if proposer is not None:
        llm.client.core.scheduler.proposer = proposer
    return llm


def full_sequences(prompts: list[list[int]], outputs) -> list[list[int]]:
    return [p + list(o.outputs[0].token_ids) for p, o in zip(prompts, outputs)]


@pytest.fixture(scope="module")
def prompts():
    return repetitive_prompts([3, 9, 17, 30, 45, 64], seed=1)


@pytest.fixture(scope="module")
def plain_greedy(qwen3_dir, prompts):
    return engine(qwen3_dir).generate(prompts, GREEDY, use_tqdm=False)


@pytest.mark.parametrize("chunked", [True, False])
def test_ngram_greedy_is_token_identical_and_both_keeps_and_rejects_drafts(qwen3_dir, prompts, plain_greedy, chunked):
    llm = spec_engine(qwen3_dir, enable_chunked_prefill=chunked)
    runner = llm.client.core.executor
    chunks, execute = [], runner.execute
    runner.execute = lambda out, *args: chunks.extend(out.token_ids) or execute(out, *args)
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == token_ids(plain_greedy)
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    # the lookup proposes ahead of a token in flight (the step before is read back after this one launches)
    assert any(len(ids) > 1 and ids[0] == PLACEHOLDER for ids in chunks)
    stats = llm.client.core.stats()
    assert 0 < stats.spec_decode_num_drafts <= checked
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 64


def test_an_always_right_proposer_keeps_every_draft_in_fewer_steps(qwen3_dir, prompts, plain_greedy):
    llm = spec_engine(qwen3_dir, ReferenceProposer(full_sequences(prompts, plain_greedy)))
    steps = 0
    for prompt in prompts:
        llm.add_request(prompt, GREEDY)
    outputs = {}
    while llm.has_unfinished_requests():
        steps += 1
        outputs.update((o.request_id, o) for o in llm.step())
    assert [o.outputs[0].token_ids for o in sorted(outputs.values(), key=lambda o: int(o.request_id))] == token_ids(
        plain_greedy
    )
    checked, kept = acceptance(llm)
    assert checked == kept > 0
    # a prefill, then 4 tokens a step (3 drafts and the one after them) for 39 tokens, and a read-back
    assert steps <= 1 + 10 + 1


def test_an_always_wrong_proposer_keeps_nothing_and_changes_nothing(qwen3_dir, prompts, plain_greedy):
    llm = spec_engine(qwen3_dir, ReferenceProposer(full_sequences(prompts, plain_greedy), wrong=True))
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == token_ids(plain_greedy)
    checked, kept = acceptance(llm)
    assert checked > 0 and kept == 0


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_verify_steps_replay_graphs_of_their_own_and_change_no_token(qwen3_dir, prompts, sampling):
    # a verify step is a decode step of num_speculative_tokens + 1 queries per request, padded, replayed from
    # graphs captured for it (on a GPU the real ones, on the CPU a stand-in that runs the captured step); greedy
    # rows are sampled inside the graph, seeded top-k ones by the full sampler after it
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        if sampling == "greedy"
        else SamplingParams(temperature=0.8, top_k=5, seed=i, max_tokens=40, ignore_eos=True)
        for i in range(len(prompts))
    ]
    plain = token_ids(engine(qwen3_dir, enforce_eager=True).generate(prompts, params, use_tqdm=False))
    llm = spec_engine(qwen3_dir)
    runner = llm.client.core.executor
    if not torch.cuda.is_available():
        runner.graphs = GraphsReplayedEagerly(runner)
    replays = []
    replay = runner.graphs.replay
    runner.graphs.replay = lambda size, queries=1: replays.append(queries) or replay(size, queries)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    assert replays.count(1 + NGRAM["num_speculative_tokens"]) > 0 and replays.count(1) > 0


def test_prefix_hits_and_preemption_give_the_same_tokens(qwen3_dir):
    shared = repetitive_prompts([3 * BLOCK], seed=2)[0]
    prompts = [shared + p for p in repetitive_prompts([2, 9, 20, 5, 13, 1], seed=3)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    # admitted while their prompts fit (no room kept for decoding), the requests outgrow the pool
    kwargs = dict(num_kvcache_blocks=14, max_num_batched_tokens=256, schedule_conservativeness=0)
    plain = token_ids(engine(qwen3_dir, **kwargs).generate(prompts, params, use_tqdm=False))
    llm = spec_engine(qwen3_dir, **kwargs)
    preempted = record_preemptions(llm)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    assert preempted
    stats = llm.client.core.stats()
    assert stats.prefix_cache_hits > 0 and stats.spec_decode_num_accepted_tokens > 0
    # the prefix cache holds only confirmed tokens: a second round reads them back and changes nothing
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 14


def test_stop_tokens_and_max_tokens_inside_a_run_of_kept_drafts(qwen3_dir, prompts, plain_greedy):
    free = token_ids(plain_greedy)
    # stops a few tokens into a run of four (a right proposer keeps every run whole); odd max_tokens
    stops = [f[i] for f, i in zip(free, [5, 6, 9, 13, 2, 17])]
    params = [
        SamplingParams(temperature=0.0, max_tokens=m, stop_token_ids=[s], ignore_eos=True)
        for s, m in zip(stops, [7, 40, 11, 23, 40, 33])
    ]
    expected = token_ids(engine(qwen3_dir).generate(prompts, params, use_tqdm=False))
    llm = spec_engine(qwen3_dir, ReferenceProposer(full_sequences(prompts, plain_greedy)))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs) == expected
    assert [len(ids) for ids in expected] != [p.max_tokens for p in params]  # some stop, some reach max_tokens
    for out, p in zip(outputs, params):
        ids = out.outputs[0].token_ids
        assert ids[-1] in p.stop_token_ids or len(ids) == p.max_tokens
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 64


def test_stop_strings_cut_as_without_speculation(qwen3_dir, prompts, plain_greedy):
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, stop=" ".join(o.outputs[0].text.split()[k : k + 2]))
        for o, k in zip(plain_greedy, [1, 4, 7, 10, 3, 6])
    ]
    expected = engine(qwen3_dir).generate(prompts, params, use_tqdm=False)
    right = ReferenceProposer(full_sequences(prompts, plain_greedy))
    for llm in (spec_engine(qwen3_dir), spec_engine(qwen3_dir, right)):
        outputs = llm.generate(prompts, params, use_tqdm=False)
        # the completion ends at the token that completes the stop string, even inside a run of kept drafts
        assert outputs == expected
        assert [o.outputs[0].finish_reason for o in outputs] == ["stop"] * len(prompts)


def test_seeded_sampling_is_identical_with_and_without_speculation(qwen3_dir, prompts):
    params = [
        SamplingParams(temperature=0.8, seed=7, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=8, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.7, min_p=0.05, seed=9, max_tokens=30, min_tokens=5, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.9, seed=10, max_tokens=30, ignore_eos=True, logit_bias={5: 2.0}),
        SamplingParams(temperature=0.6, seed=11, max_tokens=30, ignore_eos=True),
    ]
    plain = engine(qwen3_dir).generate(prompts, params, use_tqdm=False)
    right, wrong = (ReferenceProposer(full_sequences(prompts, plain), wrong=w) for w in (False, True))
    for proposer in (None, right, wrong):
        llm = spec_engine(qwen3_dir, proposer)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert token_ids(outputs) == token_ids(plain)
        for out, reference in zip(outputs, plain):
            got, want = out.outputs[0].logprobs, reference.outputs[0].logprobs
            assert (got is None) == (want is None)
            for position, expected_position in zip(got or [], want or []):
                assert position.keys() == expected_position.keys()
                for token_id, logprob in position.items():
                    assert logprob.logprob == pytest.approx(expected_position[token_id].logprob, abs=1e-4)
        checked, kept = acceptance(llm)
        assert checked > 0 and (kept == checked if proposer is right else kept < checked)


def test_requests_that_may_not_speculate_run_beside_those_that_do(qwen3_dir, prompts, plain_greedy):
    params = [
        GREEDY,
        SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20, prompt_logprobs=1, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["w5", "w7"])),
        GREEDY,
        SamplingParams(temperature=0.8, seed=3, max_tokens=20, presence_penalty=0.5, ignore_eos=True),
    ]
    plain = engine(qwen3_dir).generate(prompts, params, use_tqdm=False)
    llm = spec_engine(qwen3_dir, ReferenceProposer(full_sequences(prompts, plain)))
    asked = []
    propose = llm.client.core.scheduler.proposer.propose
    llm.client.core.scheduler.proposer.propose = lambda ids, room, req_ids: (
        asked.extend(ids) or propose(ids, room, req_ids)
    )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs) == token_ids(plain)
    assert outputs[3].outputs[0].text.strip() in ("w5", "w7")
    assert [o.prompt_logprobs for o in outputs] == [o.prompt_logprobs for o in plain]
    # only the two plain greedy requests (prompts 0 and 4) were ever asked about
    assert asked and all(
        ids[: len(prompts[i])] == prompts[i] for ids in asked for i in [0, 4] if ids[0] == prompts[i][0]
    )
    assert {ids[0] for ids in asked} == {prompts[0][0], prompts[4][0]}
    checked, kept = acceptance(llm)
    assert checked == kept > 0


class NoisyProposer(ReferenceProposer):
    """Proposes a random number of the reference's next tokens, each replaced by a random one at times; with
    `ahead`, also for requests whose newest token is in flight (the reference's next token stands for it)."""

    def __init__(self, sequences: list[list[int]], seed: int, ahead: bool):
        super().__init__(sequences, num_speculative_tokens=NGRAM["num_speculative_tokens"])
        self.rng = random.Random(seed)
        self.proposes_ahead = ahead

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        right = super().propose(token_ids, [self.rng.randint(0, k) for k in max_drafts], request_ids)
        return [[t if self.rng.random() < 0.7 else self.rng.randrange(2, 512) for t in ids] for ids in right]


@pytest.mark.parametrize("seed, chunked", [(0, True), (1, False), (2, True)])
def test_random_drafts_under_preemption_and_prefix_sharing_change_no_token(qwen3_dir, seed, chunked):
    """Greedy and seeded requests with drafts that are partly right, a KV cache that forces preemptions
    and prompts that share a prefix: the tokens and finish reasons are those of decoding without drafts."""
    rng = random.Random(seed)
    shared = repetitive_prompts([2 * BLOCK], seed=seed)[0]
    prompts = [shared * rng.randint(0, 1) + p for p in repetitive_prompts([rng.randint(1, 40) for _ in range(8)], seed)]
    # greedy and seeded sampling, with truncation, min_tokens and logprobs here and there
    params = [
        SamplingParams(
            temperature=rng.choice([0.0, 0.5, 1.0]),
            top_k=rng.choice([0, 5]),
            seed=rng.randrange(100),
            max_tokens=rng.randint(5, 40),
            min_tokens=3,
            logprobs=rng.choice([None, 1]),
        )
        for _ in prompts
    ]
    kwargs = dict(
        num_kvcache_blocks=10,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=256 if chunked else 512,
        schedule_conservativeness=0,  # admitted while their prompts fit, the requests outgrow the pool
    )
    plain = engine(qwen3_dir, **kwargs).generate(prompts, params, use_tqdm=False)
    # proposing ahead, requests with drafts in flight sit steps out and may be preempted meanwhile
    llm = spec_engine(qwen3_dir, NoisyProposer(full_sequences(prompts, plain), seed, ahead=seed != 1), **kwargs)
    preempted = record_preemptions(llm)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs) == token_ids(plain)
    assert [o.outputs[0].finish_reason for o in outputs] == [o.outputs[0].finish_reason for o in plain]
    checked, kept = acceptance(llm)
    assert 0 < kept < checked and preempted
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 10


class GuessingProposer(Proposer):
    """Proposes as many tokens as asked, ahead of a token in flight: where the context is a prefix of a
    reference sequence, its continuation with each token right with probability `right`; elsewhere (a
    context that counts rejected drafts in flight as kept) random tokens."""

    proposes_ahead = True
    num_speculative_tokens = NGRAM["num_speculative_tokens"]

    def __init__(self, sequences: list[list[int]], right: float, seed: int):
        self.sequences = sequences
        self.right = right
        self.rng = random.Random(seed)

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        proposals = []
        for ids, k in zip(token_ids, max_drafts):
            sequence = next((s for s in self.sequences if s[: len(ids)] == ids), [])
            follow = sequence[len(ids) : len(ids) + k]
            follow += [self.rng.randrange(2, 512) for _ in range(k - len(follow))]
            proposals.append([t if self.rng.random() < self.right else self.rng.randrange(2, 512) for t in follow])
        return proposals


def record_passes(llm) -> list:
    """A list that fills with each scheduled step in which some request passed its drafts in flight."""
    scheduler, passes = llm.client.core.scheduler, []
    schedule_running = scheduler._schedule_running

    def recording(*args):
        scheduled = schedule_running(*args)
        if scheduled[2]:
            passes.append(scheduled[0])
        return scheduled

    scheduler._schedule_running = recording
    return passes


@pytest.mark.parametrize(
    "right, graphs, num_blocks", [(1.0, True, 64), (0.0, True, 64), (0.7, True, 10), (0.7, False, 64)]
)
def test_requests_that_pass_their_drafts_in_flight_change_no_token(qwen3_dir, prompts, right, graphs, num_blocks):
    """Where the device runs ahead of the host, a request with drafts in flight runs in the next decode step as
    if all will be kept; the device moves that step back by those rejected. Greedy requests keep every token
    of decoding without drafts whatever is kept, through graphs or eager steps and preemption; seeded ones sit
    such steps out and keep theirs too."""
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        if i % 3
        else SamplingParams(temperature=0.8, seed=i, max_tokens=30, ignore_eos=True)
        for i in range(len(prompts))
    ]
    # admitted while prompts fit (no room kept for decoding), the requests outgrow a pool of 10 blocks
    plain = engine(qwen3_dir, num_kvcache_blocks=num_blocks, schedule_conservativeness=0).generate(
        prompts, params, use_tqdm=False
    )
    proposer = GuessingProposer(full_sequences(prompts, plain), right, seed=num_blocks)
    llm = spec_engine(qwen3_dir, proposer, num_kvcache_blocks=num_blocks, schedule_conservativeness=0)
    llm.client.core.scheduler.verify_ahead = True
    runner = llm.client.core.executor
    if graphs and not torch.cuda.is_available():
        runner.graphs = GraphsReplayedEagerly(runner)
    passes, preempted = record_passes(llm), record_preemptions(llm)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == token_ids(plain)
    checked, kept = acceptance(llm)
    assert passes and (kept == checked if right == 1.0 else kept < checked)
    assert bool(preempted) == (num_blocks < 64)
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == num_blocks
