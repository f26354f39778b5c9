"""Speculative decoding on a model with recurrent layers (the tiny Qwen3.5, Qwen3.5-MoE and Qwen3-Next) on the
CPU: a step with drafts leaves each request's state after every query aside and keeps the one after its last
kept token, so greedy output is token for token that of decoding without drafts, with n-gram drafts, with
always-wrong and half-right ones, in verify steps checked inside the decode step (greedy), by the full sampler
after it (top-k rows), in varlen steps beside prompt chunks and in steps launched before the one before was
checked; every state slot comes back once the requests end."""

import random

import pytest
import torch

from nanovllm import SamplingParams
from nanovllm.config import Config
from nanovllm.spec_decode.proposer import Proposer

from helpers.engine_probes import acceptance, engine
from helpers.graphs_replayed_eagerly import GraphsReplayedEagerly
from helpers.prompts import repetitive_prompts, token_ids
from helpers.qwen3_5_models import save_qwen3_5, save_qwen3_5_moe, save_repeating_qwen3_5
from helpers.qwen3_next_models import save_qwen3_next

K = 3  # drafts per step
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
# top-k rows need the full sampler, which checks the drafts after the decode step; greedy ones are checked in it
TOP_K_GREEDY = SamplingParams(temperature=0.0, top_k=5, max_tokens=32, ignore_eos=True)


class ReferenceProposer(Proposer):
    """Proposes what a reference run (prompt then completion) continued with, each draft replaced by a wrong
    token with probability `wrong` (1.0: always wrong), ahead of a token in flight too."""

    proposes_ahead = True
    num_speculative_tokens = K

    def __init__(self, sequences: list[list[int]], wrong: float, seed: int = 0):
        self.sequences, self.wrong, self.rng = sequences, wrong, random.Random(seed)

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        proposals = []
        for ids, k in zip(token_ids, max_drafts):
            sequence = next((s for s in self.sequences if s[: len(ids)] == ids), [])
            follow = sequence[len(ids) : len(ids) + k]
            follow += [2] * (k - len(follow))  # a context no reference continues: guesses are rejected
            proposals.append([2 + t % 509 if self.rng.random() < self.wrong else t for t in follow])
        return proposals


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory):
    return save_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5"))


@pytest.fixture(scope="module")
def repeating_qwen3_5_dir(tmp_path_factory):
    return save_repeating_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5-repeating"))


@pytest.fixture(scope="module")
def prompts():
    return repetitive_prompts([3, 9, 17, 30, 45, 64], seed=1)


@pytest.fixture(scope="module")
def plain(qwen3_5_dir, prompts):
    """Each prompt's greedy tokens without speculation."""
    return token_ids(engine(qwen3_5_dir).generate(prompts, GREEDY, use_tqdm=False))


def spec_engine(model_dir, proposer: Proposer | None = None, **kwargs):
    """A tiny engine with n-gram speculation, its proposer replaced by `proposer` when given."""
    llm = engine(model_dir, speculative_config=NGRAM, **kwargs)
    if proposer is not None:
        llm.client.core.scheduler.proposer = proposer
    return llm


def record_steps_with_drafts(llm) -> list[bool]:
    """A list that fills with whether each step with drafts is a varlen one (prompt chunks beside)."""
    runner, varlen = llm.client.core.executor, []
    execute = runner.execute

    def recording(out, *args):
        if out.draft_token_ids is not None:
            varlen.append(not out.is_decode)
        return execute(out, *args)

    runner.execute = recording
    return varlen


def assert_every_state_slot_returned(llm) -> None:
    states = llm.client.core.scheduler.kv_cache.states
    assert len(states.free_slots) + len(states.cached) == states.num_slots


@pytest.mark.parametrize("graphs", [False, True])
def test_ngram_drafts_keep_and_reject_and_change_no_token(repeating_qwen3_5_dir, prompts, graphs):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    plain = token_ids(engine(repeating_qwen3_5_dir).generate(prompts, params, use_tqdm=False))
    llm = spec_engine(repeating_qwen3_5_dir)
    if graphs:  # the decode step as a graph runs it: greedy rows checked, and states kept, inside it
        llm.client.core.executor.graphs = GraphsReplayedEagerly(llm.client.core.executor)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    assert_every_state_slot_returned(llm)


@pytest.mark.parametrize("wrong", [1.0, 0.5])
@pytest.mark.parametrize("params", [GREEDY, TOP_K_GREEDY], ids=["checked-in-step", "full-sampler"])
def test_wrong_and_half_right_drafts_change_no_token(qwen3_5_dir, prompts, plain, wrong, params):
    sequences = [p + t for p, t in zip(prompts, plain)]
    llm = spec_engine(qwen3_5_dir, ReferenceProposer(sequences, wrong))
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    checked, kept = acceptance(llm)
    assert checked > 0 and (kept == 0 if wrong == 1.0 else 0 < kept < checked)
    assert_every_state_slot_returned(llm)


@pytest.mark.parametrize("save", [save_qwen3_5_moe, save_qwen3_next], ids=["qwen3_5_moe", "qwen3_next"])
def test_half_right_drafts_change_no_token_of_the_mixture_of_experts_hybrids(save, prompts, tmp_path):
    model_dir = save(tmp_path)
    plain = token_ids(engine(model_dir).generate(prompts, GREEDY, use_tqdm=False))
    llm = spec_engine(model_dir, ReferenceProposer([p + t for p, t in zip(prompts, plain)], 0.5))
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == plain
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    assert_every_state_slot_returned(llm)


def test_drafts_in_varlen_steps_beside_prompt_chunks_change_no_token(qwen3_5_dir, prompts, plain):
    """Two requests at a time and a small token budget: requests decode with drafts while the next prompts
    are absorbed in chunks, in the same steps."""
    sequences = [p + t for p, t in zip(prompts, plain)]
    llm = spec_engine(qwen3_5_dir, ReferenceProposer(sequences, 0.5), max_num_seqs=2, max_num_batched_tokens=16)
    varlen = record_steps_with_drafts(llm)
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == plain
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    assert any(varlen) and not all(varlen)
    assert_every_state_slot_returned(llm)


@pytest.mark.parametrize("params", [GREEDY, TOP_K_GREEDY], ids=["checked-in-step", "full-sampler"])
def test_steps_launched_before_the_check_before_them_change_no_token(qwen3_5_dir, prompts, plain, params):
    """As on a GPU: a request with drafts in flight runs in the next decode step as if all will be kept; the
    state it starts from is the one after its kept tokens, which the step before left in its slot."""
    sequences = [p + t for p, t in zip(prompts, plain)]
    llm = spec_engine(qwen3_5_dir, ReferenceProposer(sequences, 0.5))
    llm.client.core.scheduler.verify_ahead = True
    llm.client.core.executor.graphs = GraphsReplayedEagerly(llm.client.core.executor)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    assert_every_state_slot_returned(llm)


@pytest.mark.gpu
@pytest.mark.parametrize("params", [GREEDY, TOP_K_GREEDY], ids=["checked-in-step", "full-sampler"])
def test_half_right_drafts_on_the_gpu_change_no_token(qwen3_5_dir, prompts, params):
    """On CUDA: the Triton kernels keep the per-position states, verify steps run in CUDA graphs and are
    launched before the step before them is checked."""
    plain = token_ids(engine(qwen3_5_dir, device="cuda").generate(prompts, GREEDY, use_tqdm=False))
    sequences = [p + t for p, t in zip(prompts, plain)]
    llm = spec_engine(qwen3_5_dir, ReferenceProposer(sequences, 0.5), device="cuda")
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    assert_every_state_slot_returned(llm)


def test_the_per_position_states_are_bound_to_every_recurrent_layer(qwen3_5_dir):
    runner = spec_engine(qwen3_5_dir).client.core.executor
    layers = runner.recurrent_layers
    assert len(layers) == 6 and runner.draft_states is not None
    views = {layer.recurrent_steps.data_ptr() for layer in layers}
    assert len(views) == len(layers)
    assert all(layer.recurrent_steps.shape[:2] == (runner.config.max_num_seqs, K + 1) for layer in layers)
    assert all(torch.is_tensor(layer.conv_steps) for layer in layers)


def test_a_draft_model_with_recurrent_layers_is_refused(qwen3_5_dir):
    settings = {"method": "draft_model", "model": qwen3_5_dir, "num_speculative_tokens": K}
    with pytest.raises(ValueError, match=r"\(Qwen3_5ForCausalLM\) has recurrent layers, .* method 'ngram'"):
        Config(qwen3_5_dir, speculative_config=settings)
