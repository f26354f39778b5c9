"""Chunked prefill end to end: long prompts split over steps, mixed steps of decodes and prompt chunks,
and preemption mid-prompt all give the greedy output of unchunked runs (on the CPU, and with the compiled
Triton kernels and CUDA graphs on a GPU)."""

import pytest

from nanovllm import LLM, SamplingParams

from helpers.engine_probes import record_batches
from helpers.gpu_cases import GPU_GREEDY, gpu_prompts
from helpers.prompts import random_prompts, token_ids
from helpers.stepping import completions_of, run_steps

BLOCK = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ENGINE = dict(block_size=BLOCK, max_model_len=512)


def unchunked(model_dir, prompts, params=GREEDY) -> list[list[int]]:
    """Greedy outputs with whole-prompt prefills in a budget that holds any prompt."""
    llm = LLM(model_dir, enable_chunked_prefill=False, max_num_batched_tokens=512, num_kvcache_blocks=128, **ENGINE)
    return token_ids(llm.generate(prompts, params, use_tqdm=False))


def test_prompt_three_times_the_budget_equals_unchunked_run(qwen3_dir):
    [prompt] = random_prompts([200], seed=11)
    llm = LLM(qwen3_dir, max_num_batched_tokens=64, num_kvcache_blocks=64, **ENGINE)
    batches = record_batches(llm)
    assert token_ids(llm.generate([prompt], GREEDY, use_tqdm=False)) == unchunked(qwen3_dir, [prompt])
    # 64 + 64 + 64 + 8 tokens; only the last chunk samples
    assert batches[:4] == [([64], [False], True)] * 3 + [([8], [True], True)]
    assert all(counts == [1] and not is_prefill for counts, _, is_prefill in batches[4:])


@pytest.mark.parametrize("budget", [40, 48, 17])
def test_chunk_boundaries_inside_and_at_block_edges(qwen3_dir, budget):
    # 40 ends chunks mid-block, 48 on block edges, 17 one token past an edge
    prompts = random_prompts([130, 96], seed=12)
    llm = LLM(qwen3_dir, max_num_batched_tokens=budget, num_kvcache_blocks=64, **ENGINE)
    batches = record_batches(llm)
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == unchunked(qwen3_dir, prompts)
    assert all(sum(counts) <= budget for counts, _, _ in batches)
    assert sum(samples.count(False) for _, samples, _ in batches) >= 130 // budget


def test_triton_kernels_on_chunks_and_mixed_steps_equal_unchunked_run(qwen3_dir):
    # on the CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1)
    pytest.importorskip("triton")
    prompts = random_prompts([6, 45], seed=17)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = LLM(qwen3_dir, attention_backend="triton", max_num_batched_tokens=16, num_kvcache_blocks=16, **ENGINE)
    batches = record_batches(llm)
    assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == unchunked(qwen3_dir, prompts, params)
    assert ([1, 15], [True, False], True) in batches


def test_mixed_steps_equal_separate_runs(qwen3_dir):
    short = random_prompts([5, 17, 30], seed=13)
    [long] = random_prompts([150], seed=14)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(qwen3_dir, max_num_batched_tokens=32, num_kvcache_blocks=64, **ENGINE)
    batches = record_batches(llm)
    ids = [llm.add_request(p, params) for p in short]
    outputs = run_steps(llm, {}, steps=4)  # the short prompts are prefilled and decoding
    assert all(c.token_ids for c in completions_of(outputs, ids))
    ids.append(llm.add_request(long, params))
    run_steps(llm, outputs)
    alone = [unchunked(qwen3_dir, [p], params)[0] for p in short + [long]]
    assert [c.token_ids for c in completions_of(outputs, ids)] == alone
    # decodes first, then a chunk of the long prompt that does not sample yet
    mixed = [
        (counts, samples)
        for counts, samples, is_prefill in batches
        if is_prefill and counts[:3] == [1, 1, 1] and samples[-1] is False
    ]
    assert mixed and all(counts[3] == 29 for counts, _ in mixed)


def test_preemption_in_the_middle_of_a_chunked_prefill(qwen3_dir):
    decoding = random_prompts([14, 14, 14, 14], seed=15)
    [long] = random_prompts([150], seed=16)
    # the decodes cross into their second block while the long prompt holds the rest of the pool
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 4 + [GREEDY]
    llm = LLM(qwen3_dir, max_num_batched_tokens=32, num_kvcache_blocks=16, schedule_conservativeness=0, **ENGINE)
    preempted = []
    scheduler = llm.client.core.scheduler
    original = scheduler._preempt

    def recording_preempt(req):
        preempted.append((req, req.num_output_tokens, req.num_computed_tokens))
        original(req)

    scheduler._preempt = recording_preempt
    ids = [llm.add_request(p, sp) for p, sp in zip(decoding, params)]
    outputs = run_steps(llm, {}, steps=1)
    ids.append(llm.add_request(long, params[-1]))
    run_steps(llm, outputs)
    [(req, completion, computed)] = preempted
    assert req.request_id == ids[-1] and completion == 0 and 0 < computed < len(long)
    # re-admitted, it resumed from the full blocks it had computed, which the prefix cache kept
    assert req.num_cached_tokens == outputs[ids[-1]].num_cached_tokens == computed // BLOCK * BLOCK > 0
    expected = [unchunked(qwen3_dir, [p], sp)[0] for p, sp in zip(decoding + [long], params)]
    assert [c.token_ids for c in completions_of(outputs, ids)] == expected


@pytest.mark.gpu
def test_triton_chunked_prefill_in_fp32_equals_whole_prompts(qwen3_dir):
    # 357 tokens, then the usual
    batch = [gpu_prompts(seed=6)[-1] + gpu_prompts(seed=7)[-1][:100]] + gpu_prompts(seed=8)
    kwargs = dict(attention_backend="triton", block_size=16, max_model_len=512)
    whole = LLM(qwen3_dir, enable_chunked_prefill=False, **kwargs)
    chunked = LLM(qwen3_dir, max_num_batched_tokens=64, **kwargs)
    batches = record_batches(chunked)
    assert token_ids(chunked.generate(batch, GPU_GREEDY, use_tqdm=False)) == token_ids(
        whole.generate(batch, GPU_GREEDY, use_tqdm=False)
    )
    assert sum(samples.count(False) for _, samples, _ in batches) >= 357 // 64


@pytest.mark.gpu
def test_triton_mixed_steps_equal_separate_runs_and_decodes_still_replay_graphs(qwen3_dir):
    short, long = gpu_prompts(seed=9)[:5], gpu_prompts(seed=10)[-1] * 2  # 514 tokens
    kwargs = dict(attention_backend="triton", block_size=16, max_model_len=1024)
    alone = LLM(qwen3_dir, enable_chunked_prefill=False, **kwargs)
    expected = [alone.generate([p], GPU_GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in short + [long]]
    llm = LLM(qwen3_dir, max_num_batched_tokens=128, **kwargs)
    batches = record_batches(llm)
    replays = []
    graphs = llm.client.core.executor.graphs
    original_replay = graphs.replay
    graphs.replay = lambda size, queries=1: replays.append(size) or original_replay(size, queries)
    ids = [llm.add_request(p, GPU_GREEDY) for p in short]
    outputs = run_steps(llm, {}, steps=3)
    ids.append(llm.add_request(long, GPU_GREEDY))
    assert [c.token_ids for c in completions_of(run_steps(llm, outputs), ids)] == expected
    assert any(is_prefill and counts[:5] == [1] * 5 and not samples[-1] for counts, samples, is_prefill in batches)
    assert len(replays) == sum(not is_prefill for _, _, is_prefill in batches) > 0
