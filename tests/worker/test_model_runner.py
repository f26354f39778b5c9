"""ModelRunner: the start-up steps (warm-up at the largest batch, the cached-prefix compile) leave no trace;
on a GPU, start-up compiles every kernel variant, the KV cache is sized from the memory left, sampled ids
come back through pinned memory."""

import gc

import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.worker.warm_up import start_up_step, warm_up_cached_prefix

from helpers.engine_probes import record_batches
from helpers.gpu_cases import GPU_GREEDY, gpu_prompts
from helpers.graphs_replayed_eagerly import GraphsReplayedEagerly

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[3, 4, 5] * 7, [9] * 18 + [10], [11, 12]]


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_cached_prefix_warm_up_step_leaves_generation_unchanged(qwen3_dir, backend):
    # On CUDA this step runs at start-up, before any request; it writes one K/V
    # slot of block 0, which the first sequence to get that block overwrites.
    kwargs = dict(attention_backend=backend, block_size=16, num_kvcache_blocks=16, max_model_len=128)
    expected = [o.outputs[0].token_ids for o in LLM(qwen3_dir, **kwargs).generate(PROMPTS, GREEDY, use_tqdm=False)]
    warmed = LLM(qwen3_dir, **kwargs)
    warm_up_cached_prefix(warmed.client.core.executor._run_start_up_step, 1)
    assert warmed.client.core.scheduler.kv_cache.num_free_blocks == 16
    assert [o.outputs[0].token_ids for o in warmed.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected


def test_start_up_step_without_blocks_stores_nothing_and_samples_every_request(qwen3_dir):
    # the warm-up at the largest batch: whole prompts that own no KV blocks
    llm = LLM(qwen3_dir, block_size=16, num_kvcache_blocks=16, max_model_len=128)
    runner = llm.client.core.executor
    cache = runner.kv_cache.values.clone()
    pending = runner.execute(start_up_step([[5] * 100, [6] * 37], [0, 0], [[[]], [[]]]))
    assert len(pending.result().sampled_token_ids) == 2
    assert torch.equal(runner.kv_cache.values, cache)


TOP_P = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
]


@pytest.mark.parametrize("graphs", [False, True])
def test_a_decode_step_that_needs_the_full_sampler_runs_the_lm_head_once(qwen3_dir, graphs):
    # A top-p row takes the full sampler; the decode step (a graph replay, or eager) must hand it the
    # logits it computed rather than the runner scoring the hidden states again. On CPU a stand-in replays
    # the step as a graph would; on a GPU the real graphs replay.
    llm = LLM(qwen3_dir, block_size=16, num_kvcache_blocks=16, max_model_len=128, enforce_eager=not graphs)
    runner = llm.client.core.executor
    stand_in = graphs and runner.graphs is None
    if stand_in:
        runner.graphs = GraphsReplayedEagerly(runner)
    steps, replays, head_calls = [], [], {"in a replay": 0, "outside": 0}
    head_forward, execute = runner.model.lm_head.forward, runner.execute

    def counted_head(*args, **kwargs):
        head_calls["in a replay" if replays and replays[-1] is None else "outside"] += 1
        return head_forward(*args, **kwargs)

    def counted_replay(size, queries=1, replay=runner.graphs.replay if graphs else None):
        replays.append(None)  # a captured graph runs no Python: only the stand-in's calls count here
        try:
            return replay(size, queries)
        finally:
            replays[-1] = size

    runner.model.lm_head.forward = counted_head
    runner.execute = lambda out, *args, **kwargs: steps.append(out.is_decode) or execute(out, *args, **kwargs)
    if graphs:
        runner.graphs.replay = counted_replay
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], TOP_P, use_tqdm=False)]
    # once per step: a replay's LM head is in the graph, every other step's outside it
    assert sum(steps) >= 5 and head_calls["outside"] + len(replays) == len(steps)
    assert len(replays) == (sum(steps) if graphs else 0)
    assert head_calls["in a replay"] == (len(replays) if stand_in else 0)
    eager = LLM(qwen3_dir, block_size=16, num_kvcache_blocks=16, max_model_len=128, enforce_eager=True)
    assert [o.outputs[0].token_ids for o in eager.generate(PROMPTS[:2], TOP_P, use_tqdm=False)] == tokens


def test_the_lm_head_writes_into_a_buffer_what_it_returns_without_one(qwen3_dir):
    llm = LLM(qwen3_dir, block_size=16, num_kvcache_blocks=16, max_model_len=128)
    model = llm.client.core.executor.model
    weight = model.lm_head.weight  # [vocab, hidden], on the engine's device (CUDA where a GPU is visible)
    hidden = torch.randn(3, weight.shape[1], device=weight.device, dtype=weight.dtype)
    buffer = torch.full((5, weight.shape[0]), float("nan"), device=weight.device, dtype=weight.dtype)
    logits = model.compute_logits(hidden, buffer[:3])
    assert logits.data_ptr() == buffer.data_ptr() and torch.equal(logits, model.compute_logits(hidden))
    assert buffer[3:].isnan().all()


@pytest.mark.gpu
def test_sampled_ids_come_back_through_pinned_memory(qwen3_dir):
    llm = LLM(qwen3_dir, block_size=16, max_model_len=512)
    runner = llm.client.core.executor
    pendings = []
    original = runner.execute
    runner.execute = lambda out, *grammar: pendings.append(original(out, *grammar)) or pendings[-1]
    llm.generate(gpu_prompts()[:2], SamplingParams(temperature=0.0, max_tokens=4, logprobs=2), use_tqdm=False)
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


@pytest.mark.gpu
def test_no_triton_kernel_compiles_after_start_up(qwen3_dir):
    # A compile in the middle of serving stalls every running request; start-up
    # must have built every variant that prefix hits, mixed steps and sampling use.
    llm = LLM(qwen3_dir, dtype="bfloat16", block_size=16, max_model_len=512, max_num_batched_tokens=64)
    compiled = triton_variants()
    batches = record_batches(llm)
    shared = gpu_prompts(seed=12)[-1]  # 257 tokens
    llm.generate([shared + [5]], GPU_GREEDY, use_tqdm=False)
    sampled = SamplingParams(temperature=0.6, max_tokens=16, ignore_eos=True)
    llm.generate([shared + [6, 7]] + gpu_prompts(seed=13), [sampled, GPU_GREEDY] * 4, use_tqdm=False)
    assert llm.client.core.executor.graphs is not None and any(not is_prefill for _, _, is_prefill in batches)
    assert any(is_prefill and 1 in counts for counts, _, is_prefill in batches)  # a mixed step ran
    assert triton_variants() == compiled


@pytest.mark.gpu
@pytest.mark.whole_gpu
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


@pytest.mark.gpu
def test_too_little_gpu_memory_is_a_clear_error(qwen3_06b_shape_dir):
    with pytest.raises(ValueError, match="no room for the KV cache"):
        LLM(qwen3_06b_shape_dir, load_format="dummy", gpu_memory_utilization=0.01)
    torch.cuda.empty_cache()
