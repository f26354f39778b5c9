"""Method "mtp" end to end on the CPU (the tiny Qwen3.5, Qwen3.5-MoE and Qwen3-Next, each with a random MTP
layer): greedy output is token for token that of decoding without speculation and of transformers, for
mixed prompt lengths, whole and in chunks, through prefix-cache hits and preemption; seeded sampling draws
the same tokens as without drafts; and with an MTP layer made to guess the repeating model's next token the
acceptance counters add up, drafts being kept and rejected."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanovllm import SamplingParams
from nanovllm.sampling_params import StructuredOutputsParams

from helpers.engine_probes import BLOCK, acceptance, engine, record_preemptions
from helpers.hf_reference import hf_greedy
from helpers.mtp_layers import MTP_FILE
from helpers.prompts import repetitive_prompts, token_ids
from helpers.qwen3_5_models import save_qwen3_5, save_qwen3_5_moe, save_repeating_qwen3_5
from helpers.qwen3_next_models import save_qwen3_next

K = 3


def mtp(k: int = K) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k}


GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory):
    return save_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5"))


@pytest.fixture(scope="module")
def prompts():
    return repetitive_prompts([3, 9, 17, 30, 45], seed=1)


@pytest.mark.parametrize("save", [save_qwen3_5, save_qwen3_5_moe, save_qwen3_next], ids=lambda f: f.__name__[5:])
def test_greedy_tokens_equal_plain_decoding_and_transformers(save, tmp_path, prompts):
    model_dir = save(tmp_path)
    expected = hf_greedy(model_dir, prompts, GREEDY.max_tokens)
    assert token_ids(engine(model_dir).generate(prompts, GREEDY, use_tqdm=False)) == expected
    for k in (1, K):
        llm = engine(model_dir, speculative_config=mtp(k))
        assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
        checked, _ = acceptance(llm)
        assert checked > 0


def test_prompts_in_small_chunks_give_the_same_tokens(qwen3_5_dir, prompts):
    plain = token_ids(engine(qwen3_5_dir).generate(prompts, GREEDY, use_tqdm=False))
    llm = engine(qwen3_5_dir, speculative_config=mtp(), max_num_batched_tokens=16, max_num_seqs=3)
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == plain


@pytest.mark.parametrize("chunked", [True, False])
def test_prefix_hits_and_preemption_give_the_same_tokens(qwen3_5_dir, chunked):
    shared = repetitive_prompts([3 * BLOCK], seed=2)[0]
    prompts = [shared + p for p in repetitive_prompts([2, 9, 20, 5, 13, 1], seed=3)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    # admitted while their prompts fit (no room kept for decoding), the requests outgrow the pool
    kwargs = dict(
        num_kvcache_blocks=14, enable_chunked_prefill=chunked, max_num_batched_tokens=256, schedule_conservativeness=0
    )
    plain = token_ids(engine(qwen3_5_dir, **kwargs).generate(prompts, params, use_tqdm=False))
    llm = engine(qwen3_5_dir, speculative_config=mtp(), **kwargs)
    preempted = record_preemptions(llm)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    assert preempted
    assert llm.client.core.stats().prefix_cache_hits > 0
    scheduler = llm.client.core.scheduler
    assert scheduler.kv_cache.num_free_blocks == 14
    assert not scheduler.proposer._drafts  # every request's drafts were let go with it


def test_seeded_sampling_is_identical_with_and_without_drafts(qwen3_5_dir, prompts):
    params = [
        SamplingParams(temperature=0.8, seed=7, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=8, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.7, min_p=0.05, seed=9, max_tokens=20, min_tokens=5),
        SamplingParams(temperature=0.6, seed=11, max_tokens=20, ignore_eos=True),
    ]
    plain = engine(qwen3_5_dir).generate(prompts, params, use_tqdm=False)
    outputs = engine(qwen3_5_dir, speculative_config=mtp()).generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs) == token_ids(plain)
    assert [o.outputs[0].finish_reason for o in outputs] == [o.outputs[0].finish_reason for o in plain]


@pytest.fixture(scope="module")
def repeating_dir(tmp_path_factory):
    """The tiny Qwen3.5 made to repeat its input tokens in runs (its layers' outputs scaled by a quarter, its
    LM head the embeddings), with an MTP layer that guesses the token it is given again: fc passes the normed
    embedding through and the layer adds nothing, so the LM head (the embeddings) picks that token back."""
    path = save_repeating_qwen3_5(tmp_path_factory.mktemp("tiny-qwen3_5-repeating"))
    layer = load_file(Path(path) / MTP_FILE)
    hidden = layer["mtp.fc.weight"].size(0)
    layer["mtp.fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    for name in ("mtp.layers.0.self_attn.o_proj.weight", "mtp.layers.0.mlp.down_proj.weight"):
        layer[name].zero_()
    save_file(layer, Path(path) / MTP_FILE, metadata={"format": "pt"})
    return path


def test_acceptance_counters_add_up_as_drafts_are_kept_and_rejected(repeating_dir):
    prompts = repetitive_prompts([4, 11, 25], seed=5)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    plain = token_ids(engine(repeating_dir).generate(prompts, params, use_tqdm=False))
    llm = engine(repeating_dir, speculative_config=mtp())
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    stats = llm.client.core.stats()
    checked, kept = stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens
    assert 0 < kept < checked <= K * stats.spec_decode_num_drafts
    per_position = stats.spec_decode_num_accepted_tokens_per_pos
    # a draft is kept only behind the kept ones before it
    assert sum(per_position) == kept and per_position == sorted(per_position, reverse=True)
    assert per_position[0] <= stats.spec_decode_num_drafts


def test_requests_that_may_not_speculate_run_beside_those_that_do(qwen3_5_dir, prompts):
    params = [
        GREEDY,
        SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20, prompt_logprobs=1, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["w5", "w7"])),
        GREEDY,
    ]
    plain = engine(qwen3_5_dir).generate(prompts, params, use_tqdm=False)
    outputs = engine(qwen3_5_dir, speculative_config=mtp()).generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs) == token_ids(plain)
    assert outputs[3].outputs[0].text.strip() in ("w5", "w7")
    assert [o.prompt_logprobs for o in outputs] == [o.prompt_logprobs for o in plain]
