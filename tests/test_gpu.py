"""The engine on a CUDA GPU: both attention backends, CUDA graphs, KV sizing (skipped without CUDA)."""

import gc
import random

import pytest
import torch
from conftest import NEAR_TIE, completions_of, gaps_where_greedy_diverges, run_steps
from engine_probes import record_batches
from hf_reference import hf_greedy

from nanovllm import LLM, SamplingParams
from nanovllm.sample.noise import seeded_exponential

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def prompts(seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in (1, 15, 16, 17, 40, 100, 257)]


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("arch_dir", ["qwen3_dir", "llama_dir"])
def test_fp32_greedy_on_gpu_matches_transformers(arch_dir, block_size, backend, request):
    model_dir = request.getfixturevalue(arch_dir)
    llm = LLM(model_dir, device="cuda", attention_backend=backend, kvcache_block_size=block_size, max_model_len=512)
    assert token_ids(llm.generate(prompts(), GREEDY, use_tqdm=False)) == hf_greedy(
        model_dir, prompts(), GREEDY.max_tokens
    )


def test_cuda_graphs_equal_eager_with_padded_batches(qwen3_dir):
    # 7 and 19 requests replay the graphs of 8 and 20 (max_num_seqs) with padded slots
    for n in (7, 19):
        batch = prompts(seed=n) * 3
        graphed = LLM(qwen3_dir, kvcache_block_size=16, max_model_len=512, max_num_seqs=20)
        assert graphed.client.core.executor.graphs.sizes == [1, 2, 4, 8, 16, 20]
        eager = LLM(qwen3_dir, kvcache_block_size=16, max_model_len=512, max_num_seqs=20, enforce_eager=True)
        assert eager.client.core.executor.graphs is None
        assert token_ids(graphed.generate(batch[:n], GREEDY, use_tqdm=False)) == token_ids(
            eager.generate(batch[:n], GREEDY, use_tqdm=False)
        )


def test_cuda_graphs_pad_a_batch_that_grows_at_once(qwen3_dir):
    # One sequence decodes alone (graph of 1), then 19 join at once: the graph of 20
    # pads rows where the steps of 1 left a slot, a length and a -1-padded block table,
    # in whichever of the two host buffers the step lands.
    batch = (prompts(seed=11) * 3)[:20]

    def run(llm):
        ids = [llm.add_request(batch[0], GREEDY)]
        outputs = run_steps(llm, {}, steps=4)
        ids += [llm.add_request(p, GREEDY) for p in batch[1:]]
        return [c.token_ids for c in completions_of(run_steps(llm, outputs), ids)]

    kwargs = dict(kvcache_block_size=16, max_model_len=512, max_num_seqs=20)
    assert run(LLM(qwen3_dir, **kwargs)) == run(LLM(qwen3_dir, enforce_eager=True, **kwargs))


def test_triton_prefix_cache_hit_equals_cold_run(qwen3_dir):
    shared = prompts(seed=5)[-1]  # 257 tokens: 16 full blocks of 16
    llm = LLM(qwen3_dir, kvcache_block_size=16, max_model_len=512)
    llm.generate([shared + [3]], GREEDY, use_tqdm=False)
    outputs = llm.generate([shared + [4, 5], shared + [6]], GREEDY, use_tqdm=False)
    assert [o.num_cached_tokens for o in outputs] == [256, 256]
    cold = LLM(qwen3_dir, attention_backend="torch", kvcache_block_size=16, max_model_len=512)
    assert token_ids(outputs) == token_ids(cold.generate([shared + [4, 5], shared + [6]], GREEDY, use_tqdm=False))


def test_triton_chunked_prefill_in_fp32_equals_whole_prompts(qwen3_dir):
    batch = [prompts(seed=6)[-1] + prompts(seed=7)[-1][:100]] + prompts(seed=8)  # 357 tokens, then the usual
    kwargs = dict(attention_backend="triton", kvcache_block_size=16, max_model_len=512)
    whole = LLM(qwen3_dir, enable_chunked_prefill=False, **kwargs)
    chunked = LLM(qwen3_dir, max_num_batched_tokens=64, **kwargs)
    batches = record_batches(chunked)
    assert token_ids(chunked.generate(batch, GREEDY, use_tqdm=False)) == token_ids(
        whole.generate(batch, GREEDY, use_tqdm=False)
    )
    assert sum(samples.count(False) for _, samples, _ in batches) >= 357 // 64


def test_triton_mixed_steps_equal_separate_runs_and_decodes_still_replay_graphs(qwen3_dir):
    short, long = prompts(seed=9)[:5], prompts(seed=10)[-1] * 2  # 514 tokens
    kwargs = dict(attention_backend="triton", kvcache_block_size=16, max_model_len=1024)
    alone = LLM(qwen3_dir, enable_chunked_prefill=False, **kwargs)
    expected = [alone.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in short + [long]]
    llm = LLM(qwen3_dir, max_num_batched_tokens=128, **kwargs)
    batches = record_batches(llm)
    replays = []
    graphs = llm.client.core.executor.graphs
    original_replay = graphs.replay
    graphs.replay = lambda size, queries=1: replays.append(size) or original_replay(size, queries)
    ids = [llm.add_request(p, GREEDY) for p in short]
    outputs = run_steps(llm, {}, steps=3)
    ids.append(llm.add_request(long, GREEDY))
    assert [c.token_ids for c in completions_of(run_steps(llm, outputs), ids)] == expected
    assert any(is_prefill and counts[:5] == [1] * 5 and not samples[-1] for counts, samples, is_prefill in batches)
    assert len(replays) == sum(not is_prefill for _, _, is_prefill in batches) > 0


def record_src_rows(llm) -> list:
    """A list that fills with the rows each step takes from the previous step's samples on the device."""
    runner = llm.client.core.executor
    original, recorded = runner._src_rows, []
    runner._src_rows = lambda out: recorded.append(original(out)) or recorded[-1]
    return recorded


def test_device_side_input_ids_in_graphs_equal_eager_and_transformers(qwen3_dir):
    # Every decode step after the first reads its input ids from the previous step's
    # samples on the device, inside the graph when one is replayed.
    batch = prompts(seed=14)
    graphed = LLM(qwen3_dir, kvcache_block_size=16, max_model_len=512)
    src_rows = record_src_rows(graphed)
    eager = LLM(qwen3_dir, kvcache_block_size=16, max_model_len=512, enforce_eager=True)
    expected = hf_greedy(qwen3_dir, batch, GREEDY.max_tokens)
    assert token_ids(graphed.generate(batch, GREEDY, use_tqdm=False)) == expected
    assert token_ids(eager.generate(batch, GREEDY, use_tqdm=False)) == expected
    from_device = [rows for rows in src_rows if rows and all(r >= 0 for r in rows)]
    assert len(from_device) >= GREEDY.max_tokens - 2


def test_stop_tokens_mid_batch_leak_no_token_on_gpu(qwen3_dir):
    # Requests that stop at different steps while the next step is already launched:
    # each ends exactly at its stop token, and the others go on as if alone.
    llm = LLM(qwen3_dir, kvcache_block_size=16, max_model_len=512)
    batch = prompts(seed=15)
    free = token_ids(llm.generate(batch, GREEDY, use_tqdm=False))
    stops = [f[i] for f, i in zip(free, [3, 7, 11, 31, 15, 1, 20])]
    params = [SamplingParams(temperature=0.0, max_tokens=32, stop_token_ids=[s]) for s in stops]
    outputs = llm.generate(batch, params, use_tqdm=False)
    assert token_ids(outputs) == [f[: f.index(s) + 1] for f, s in zip(free, stops)]
    assert all(out.outputs[0].finish_reason == "stop" for out in outputs)
    assert llm.client.core.scheduler.block_manager.num_free_blocks == llm.client.info.num_kvcache_blocks


def test_sampled_ids_come_back_through_pinned_memory(qwen3_dir):
    llm = LLM(qwen3_dir, kvcache_block_size=16, max_model_len=512)
    runner = llm.client.core.executor
    pendings = []
    original = runner.execute
    runner.execute = lambda out, *grammar: pendings.append(original(out, *grammar)) or pendings[-1]
    llm.generate(prompts()[:2], SamplingParams(temperature=0.0, max_tokens=4, logprobs=2), use_tqdm=False)
    assert pendings and all(p._token_ids.is_pinned() and all(t.is_pinned() for t in p._logprobs) for p in pendings if p)


def triton_variants() -> dict[str, int]:
    """How many compiled variants each of our Triton kernels holds."""
    from nanovllm.kernels import (
        triton_decode_attention,
        triton_norm_rotary_store,
        triton_prefill_attention,
        triton_sampling,
    )

    kernels = [
        triton_prefill_attention._prefill_kernel,
        triton_decode_attention._decode_split_kernel,
        triton_decode_attention._merge_splits_kernel,
        triton_norm_rotary_store._norm_rotate_store_kernel,
        triton_sampling._gumbel_max_chunk_kernel,
        triton_sampling._best_chunk_kernel,
    ]
    return {k.fn.__name__: sum(len(caches[0]) for caches in k.device_caches.values()) for k in kernels}


def test_no_triton_kernel_compiles_after_start_up(qwen3_dir):
    # A compile in the middle of serving stalls every running request; start-up
    # must have built every variant that prefix hits, mixed steps and sampling use.
    llm = LLM(qwen3_dir, dtype="bfloat16", kvcache_block_size=16, max_model_len=512, max_num_batched_tokens=64)
    compiled = triton_variants()
    batches = record_batches(llm)
    shared = prompts(seed=12)[-1]  # 257 tokens
    llm.generate([shared + [5]], GREEDY, use_tqdm=False)
    sampled = SamplingParams(temperature=0.6, max_tokens=16, ignore_eos=True)
    llm.generate([shared + [6, 7]] + prompts(seed=13), [sampled, GREEDY] * 4, use_tqdm=False)
    assert llm.client.core.executor.graphs is not None and any(not is_prefill for _, _, is_prefill in batches)
    assert any(is_prefill and 1 in counts for counts, _, is_prefill in batches)  # a mixed step ran
    assert triton_variants() == compiled


def test_bf16_triton_equals_torch_path_but_at_near_ties(qwen3_dir, capsys):
    batch = [p for seed in (0, 1, 2) for p in prompts(seed)][:16]
    kwargs = dict(device="cuda", dtype="bfloat16", kvcache_block_size=16, max_model_len=512)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=2)
    triton_out = [
        o.outputs[0]
        for o in LLM(qwen3_dir, attention_backend="triton", **kwargs).generate(batch, params, use_tqdm=False)
    ]
    torch_out = [
        o.outputs[0]
        for o in LLM(qwen3_dir, attention_backend="torch", **kwargs).generate(batch, params, use_tqdm=False)
    ]
    gaps = gaps_where_greedy_diverges(triton_out, torch_out)
    with capsys.disabled():
        print(
            f"\nbf16 Triton vs torch path: {16 - len(gaps)}/16 prompts equal for all {params.max_tokens} "
            f"tokens; top-2 logprob gaps where the others diverge: {[round(g, 4) for g in gaps]}"
        )
    assert all(gap <= NEAR_TIE for gap in gaps)


def test_bf16_on_gpu_mostly_matches_fp32(qwen3_dir):
    fp32 = LLM(qwen3_dir, device="cuda", kvcache_block_size=16, max_model_len=512)
    bf16 = LLM(qwen3_dir, device="cuda", dtype="bfloat16", kvcache_block_size=16, max_model_len=512)
    a = [o.outputs[0].token_ids for o in fp32.generate(prompts(), GREEDY, use_tqdm=False)]
    b = [o.outputs[0].token_ids for o in bf16.generate(prompts(), GREEDY, use_tqdm=False)]
    # bf16 rounding may flip late near-ties; the first tokens must agree
    assert sum(x[:4] == y[:4] for x, y in zip(a, b)) >= len(a) - 1


def test_seeded_noise_on_gpu_equals_cpu():
    seeds, positions = torch.arange(8) * 977, torch.arange(8) + 100
    cpu = seeded_exponential(seeds, positions, 151936)
    gpu = seeded_exponential(seeds.cuda(), positions.cuda(), 151936).cpu()
    assert torch.allclose(cpu, gpu, rtol=1e-6)


def test_every_sampling_feature_runs_on_gpu_and_seeds_reproduce(qwen3_dir):
    llm = LLM(qwen3_dir, device="cuda", kvcache_block_size=16, max_model_len=512)
    params = [
        SamplingParams(
            temperature=0.8,
            top_k=20,
            top_p=0.9,
            min_p=0.05,
            seed=3,
            repetition_penalty=1.1,
            frequency_penalty=0.2,
            presence_penalty=0.1,
            logprobs=2,
            min_tokens=4,
            stop_token_ids=[7],
            stop=["w9 w9"],
            max_tokens=24,
        ),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    ]
    first = llm.generate(prompts()[:2], params, use_tqdm=False)
    again = llm.generate(prompts()[2:4] + prompts()[:1], params[1:] * 2 + params[:1], use_tqdm=False)
    assert again[-1].outputs[0].token_ids == first[0].outputs[0].token_ids
    assert len(first[0].outputs[0].logprobs) == len(first[0].outputs[0].token_ids)
    assert first[0].outputs[0].finish_reason in ("stop", "length") and first[1].outputs[0].finish_reason == "length"


def test_kv_cache_is_sized_from_gpu_memory_utilization_and_freed_with_the_engine(qwen3_06b_shape_dir):
    gc.disable()  # dropping the engine must free its memory without the cycle collector
    try:
        llm = LLM(qwen3_06b_shape_dir, load_format="dummy", gpu_memory_utilization=0.5)
        free, total = torch.cuda.mem_get_info()
        assert llm.client.info.num_kvcache_blocks > 10 and llm.config.num_kvcache_blocks == -1
        assert (total - free) <= 0.5 * total + (1 << 30)
        outputs = llm.generate(
            [[5] * 300, [6] * 1000], SamplingParams(temperature=0.6, max_tokens=20, ignore_eos=True), use_tqdm=False
        )
        assert [len(o.outputs[0].token_ids) for o in outputs] == [20, 20]
        del llm, outputs
        torch.cuda.empty_cache()
        assert torch.cuda.mem_get_info()[0] > free + 0.3 * total
    finally:
        gc.enable()


def test_too_little_gpu_memory_is_a_clear_error(qwen3_06b_shape_dir):
    with pytest.raises(ValueError, match="no room for the KV cache"):
        LLM(qwen3_06b_shape_dir, load_format="dummy", gpu_memory_utilization=0.01)
    torch.cuda.empty_cache()
