"""Speculative decoding with a draft model, end to end on the CPU: with a different tiny model as the draft
(a noisy copy of the target), greedy and seeded outputs are token for token those of decoding without
speculation, through mixed prompt lengths, max_tokens inside a run of kept drafts, preemption and prefix
sharing; the target as its own draft keeps every draft in fewer steps; and the draft's folder is checked up
front."""

import random

import pytest

from nanovllm import SamplingParams
from nanovllm.config import Config

from helpers.draft_models import save_changed_config, save_noisy_copy
from helpers.engine_probes import BLOCK, acceptance, engine, record_preemptions
from helpers.prompts import repetitive_prompts, token_ids


def draft_settings(draft_dir: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": k}


def draft_engine(target_dir: str, draft_dir: str, **kwargs):
    """A tiny engine whose drafts come from the model in `draft_dir`."""
    return engine(target_dir, speculative_config=draft_settings(draft_dir), **kwargs)


def assert_draft_cache_empty(llm) -> None:
    """Every request's draft blocks went back once it finished."""
    proposer = llm.client.core.proposer
    assert not proposer.caches
    assert len(proposer.free_blocks) == proposer.runner.num_kvcache_blocks


@pytest.fixture(scope="module")
def draft_dir(qwen3_dir, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny-qwen3-draft"))
    save_noisy_copy(qwen3_dir, path, noise=0.05)
    return path


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(4)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in (1, 6, 15, 16, 33, 70)]


def test_greedy_with_a_different_draft_is_token_identical(qwen3_dir, draft_dir, prompts):
    # odd max_tokens, so that some requests end inside a run of kept drafts
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 7, 23, 31, 12, 40)]
    plain = token_ids(engine(qwen3_dir).generate(prompts, params, use_tqdm=False))
    llm = draft_engine(qwen3_dir, draft_dir)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    assert [len(ids) for ids in plain] == [p.max_tokens for p in params]
    checked, kept = acceptance(llm)
    assert 0 < kept < checked
    assert_draft_cache_empty(llm)
    assert llm.client.core.scheduler.kv_cache.num_free_blocks == 64


@pytest.mark.parametrize("chunked", [True, False])
def test_preemption_and_prefix_sharing_change_no_token(qwen3_dir, draft_dir, chunked):
    shared = repetitive_prompts([3 * BLOCK], seed=2)[0]
    prompts = [shared + p for p in repetitive_prompts([2, 9, 20, 5, 13, 1], seed=3)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    # admitted while their prompts fit (no room kept for decoding), the requests outgrow the pool
    kwargs = dict(
        num_kvcache_blocks=14, enable_chunked_prefill=chunked, max_num_batched_tokens=256, schedule_conservativeness=0
    )
    plain = token_ids(engine(qwen3_dir, **kwargs).generate(prompts, params, use_tqdm=False))
    llm = draft_engine(qwen3_dir, draft_dir, **kwargs)
    preempted = record_preemptions(llm)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == plain
    assert preempted
    stats = llm.client.core.stats()
    assert stats.prefix_cache_hits > 0 and stats.spec_decode_num_accepted_tokens > 0
    assert_draft_cache_empty(llm)


def steps_to_finish(llm, prompts, params) -> tuple[int, list[list[int]]]:
    """Engine steps until every request is done, and the completions in request order."""
    for prompt in prompts:
        llm.add_request(prompt, params)
    steps, outputs = 0, {}
    while llm.has_unfinished_requests():
        steps += 1
        outputs.update((o.request_id, o) for o in llm.step())
    return steps, token_ids(sorted(outputs.values(), key=lambda o: int(o.request_id)))


def test_the_target_as_its_own_draft_keeps_every_draft_in_fewer_steps(qwen3_dir, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    plain_steps, plain = steps_to_finish(engine(qwen3_dir), prompts, params)
    llm = draft_engine(qwen3_dir, qwen3_dir)
    steps, outputs = steps_to_finish(llm, prompts, params)
    assert outputs == plain
    stats = llm.client.stats()
    assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens > 0
    # 4 tokens a step (3 drafts and the one after them) rather than 1
    assert steps < plain_steps / 2
    assert_draft_cache_empty(llm)


def test_seeded_sampling_is_identical_with_and_without_the_draft(qwen3_dir, draft_dir, prompts):
    params = [
        SamplingParams(temperature=0.8, seed=7, max_tokens=25, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=8, max_tokens=25, ignore_eos=True),
        SamplingParams(temperature=0.7, min_p=0.05, seed=9, max_tokens=25, min_tokens=5),
        SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True),
        SamplingParams(temperature=0.3, seed=10, max_tokens=25, ignore_eos=True, logit_bias={5: 2.0}),
        SamplingParams(temperature=0.6, seed=11, max_tokens=25, ignore_eos=True),
    ]
    plain = engine(qwen3_dir).generate(prompts, params, use_tqdm=False)
    llm = draft_engine(qwen3_dir, draft_dir)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs) == token_ids(plain)
    assert [o.outputs[0].finish_reason for o in outputs] == [o.outputs[0].finish_reason for o in plain]
    checked, kept = acceptance(llm)
    assert 0 < kept < checked


def test_a_missing_draft_folder_says_what_to_change(qwen3_dir, tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match=r"speculative_config 'model' \(the draft model .*does not exist"):
        Config(qwen3_dir, speculative_config=draft_settings(missing))


def test_a_draft_with_another_vocabulary_is_refused(qwen3_dir, tmp_path):
    save_changed_config(qwen3_dir, str(tmp_path), vocab_size=600)
    with pytest.raises(ValueError, match="vocabulary of 600 tokens but the target model .* has 512"):
        Config(qwen3_dir, speculative_config=draft_settings(str(tmp_path)))


def test_a_draft_shorter_than_max_model_len_is_refused(qwen3_dir, tmp_path):
    save_changed_config(qwen3_dir, str(tmp_path), max_position_embeddings=128)
    with pytest.raises(ValueError, match=r"the draft model .*max_model_len=256 exceeds the model's limit of 128"):
        Config(qwen3_dir, max_model_len=256, speculative_config=draft_settings(str(tmp_path)))


def test_the_draft_runs_on_one_rank(qwen3_dir, draft_dir):
    # on the CPU, where two ranks need no second GPU (a one-GPU machine refuses them for that first)
    with pytest.raises(ValueError, match="tensor_parallel_size=1 only"):
        Config(qwen3_dir, device="cpu", tensor_parallel_size=2, speculative_config=draft_settings(draft_dir))


def test_the_draft_config_is_the_targets_with_the_drafts_folder(qwen3_dir, draft_dir):
    config = Config(qwen3_dir, max_model_len=256, block_size=BLOCK, speculative_config=draft_settings(draft_dir))
    draft = config.draft_config
    assert (draft.model, draft.context_len, draft.kv_block_size) == (draft_dir, 256, BLOCK)
    assert draft.speculative is None and draft.draft_config is None
    assert Config(qwen3_dir).draft_config is None
