"""ModelRunner: the start-up step that compiles the cached-prefix path leaves no trace."""

import pytest

from nanovllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[3, 4, 5] * 7, [9] * 18 + [10], [11, 12]]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cached_prefix_warm_up_step_leaves_generation_unchanged(qwen3_dir, backend):
    # On CUDA this step runs at start-up, before any request; it writes one K/V
    # slot of block 0, which the first sequence to get that block overwrites.
    kwargs = dict(attention_backend=backend, kvcache_block_size=16, num_kvcache_blocks=16, max_model_len=128)
    expected = [o["token_ids"] for o in LLM(qwen3_dir, **kwargs).generate(PROMPTS, GREEDY, use_tqdm=False)]
    warmed = LLM(qwen3_dir, **kwargs)
    warmed.engine_core.model_runner._warm_up_cached_prefix()
    assert warmed.engine_core.scheduler.block_manager.num_free_blocks == 16
    assert [o["token_ids"] for o in warmed.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected
