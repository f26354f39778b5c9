"""ModelRunner: the start-up steps (warm-up at the largest batch, the cached-prefix compile) leave no trace."""

import pytest
import torch
from graphs_replayed_eagerly import GraphsReplayedEagerly

from nanovllm import LLM, SamplingParams
from nanovllm.worker.model_runner import start_up_step

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[3, 4, 5] * 7, [9] * 18 + [10], [11, 12]]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cached_prefix_warm_up_step_leaves_generation_unchanged(qwen3_dir, backend):
    # On CUDA this step runs at start-up, before any request; it writes one K/V
    # slot of block 0, which the first sequence to get that block overwrites.
    kwargs = dict(attention_backend=backend, kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=128)
    expected = [o.outputs[0].token_ids for o in LLM(qwen3_dir, **kwargs).generate(PROMPTS, GREEDY, use_tqdm=False)]
    warmed = LLM(qwen3_dir, **kwargs)
    warmed.client.core.executor._warm_up_cached_prefix()
    assert warmed.client.core.scheduler.block_manager.num_free_blocks == 16
    assert [o.outputs[0].token_ids for o in warmed.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected


def test_start_up_step_without_blocks_stores_nothing_and_samples_every_request(qwen3_dir):
    # the warm-up at the largest batch: whole prompts that own no KV blocks
    llm = LLM(qwen3_dir, kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=128)
    runner = llm.client.core.executor
    cache = runner.kv_cache.kv.clone()
    pending = runner.execute(start_up_step([[5] * 100, [6] * 37], [0, 0], [[], []]))
    assert len(pending.result().sampled_token_ids) == 2
    assert torch.equal(runner.kv_cache.kv, cache)


TOP_P = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
]


@pytest.mark.parametrize("graphs", [False, True])
def test_a_decode_step_that_needs_the_full_sampler_runs_the_lm_head_once(qwen3_dir, graphs):
    # A top-p row takes the full sampler; the decode step (a graph replay, or eager) must hand it the
    # logits it computed rather than the runner scoring the hidden states again. On CPU a stand-in replays
    # the step as a graph would; on a GPU the real graphs replay.
    llm = LLM(qwen3_dir, kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=128, enforce_eager=not graphs)
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
    eager = LLM(qwen3_dir, kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=128, enforce_eager=True)
    assert [o.outputs[0].token_ids for o in eager.generate(PROMPTS[:2], TOP_P, use_tqdm=False)] == tokens


def test_the_lm_head_writes_into_a_buffer_what_it_returns_without_one(qwen3_dir):
    llm = LLM(qwen3_dir, kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=128)
    model = llm.client.core.executor.model
    weight = model.lm_head.weight  # [vocab, hidden], on the engine's device (CUDA where a GPU is visible)
    hidden = torch.randn(3, weight.shape[1], device=weight.device, dtype=weight.dtype)
    buffer = torch.full((5, weight.shape[0]), float("nan"), device=weight.device, dtype=weight.dtype)
    logits = model.compute_logits(hidden, buffer[:3])
    assert logits.data_ptr() == buffer.data_ptr() and torch.equal(logits, model.compute_logits(hidden))
    assert buffer[3:].isnan().all()
