"""The engine on a CUDA GPU with the PyTorch attention path (skipped without CUDA)."""

import random

import pytest
import torch
from hf_reference import hf_greedy

from nanovllm import LLM, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def prompts(seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in (1, 15, 16, 17, 40, 100, 257)]


@pytest.mark.parametrize("arch_dir", ["qwen3_dir", "llama_dir"])
def test_fp32_greedy_on_gpu_matches_transformers(arch_dir, request):
    model_dir = request.getfixturevalue(arch_dir)
    llm = LLM(model_dir, device="cuda", kvcache_block_size=16, max_model_len=512)
    outputs = llm.generate(prompts(), GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outputs] == hf_greedy(model_dir, prompts(), GREEDY.max_tokens)


def test_bf16_on_gpu_mostly_matches_fp32(qwen3_dir):
    fp32 = LLM(qwen3_dir, device="cuda", kvcache_block_size=16, max_model_len=512)
    bf16 = LLM(qwen3_dir, device="cuda", dtype="bfloat16", kvcache_block_size=16, max_model_len=512)
    a = [o["token_ids"] for o in fp32.generate(prompts(), GREEDY, use_tqdm=False)]
    b = [o["token_ids"] for o in bf16.generate(prompts(), GREEDY, use_tqdm=False)]
    # bf16 rounding may flip late near-ties; the first tokens must agree
    assert sum(x[:4] == y[:4] for x, y in zip(a, b)) >= len(a) - 1


def test_kv_cache_is_sized_from_gpu_memory_utilization(qwen3_06b_shape_dir):
    llm = LLM(qwen3_06b_shape_dir, load_format="dummy", gpu_memory_utilization=0.5)
    free, total = torch.cuda.mem_get_info()
    assert llm.config.num_kvcache_blocks > 10
    assert (total - free) <= 0.5 * total + (1 << 30)
    outputs = llm.generate([[5] * 300, [6] * 1000], SamplingParams(temperature=0.6, max_tokens=20, ignore_eos=True),
                           use_tqdm=False)
    assert [len(o["token_ids"]) for o in outputs] == [20, 20]
    del llm
    torch.cuda.empty_cache()


def test_too_little_gpu_memory_is_a_clear_error(qwen3_06b_shape_dir):
    with pytest.raises(ValueError, match="no room for the KV cache"):
        LLM(qwen3_06b_shape_dir, load_format="dummy", gpu_memory_utilization=0.01)
    torch.cuda.empty_cache()
