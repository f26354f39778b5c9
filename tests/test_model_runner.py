"""ModelRunner: the start-up steps (warm-up at the largest batch, the cached-prefix compile) leave no trace."""

import pytest
import torch

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
