"""The engine on a CUDA GPU with the PyTorch attention path (skipped without CUDA)."""

import json
import os
import random

import pytest
import torch
from conftest import save_tiny_tokenizer
from hf_reference import hf_greedy

from nanovllm import LLM, SamplingParams
from nanovllm.layers.seeded_noise import seeded_exponential

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


def test_seeded_noise_on_gpu_equals_cpu():
    seeds, positions = torch.arange(8) * 977, torch.arange(8) + 100
    cpu = seeded_exponential(seeds, positions, 151936)
    gpu = seeded_exponential(seeds.cuda(), positions.cuda(), 151936).cpu()
    assert torch.allclose(cpu, gpu, rtol=1e-6)


def test_every_sampling_feature_runs_on_gpu_and_seeds_reproduce(qwen3_dir):
    llm = LLM(qwen3_dir, device="cuda", kvcache_block_size=16, max_model_len=512)
    params = [SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=3, repetition_penalty=1.1,
                             frequency_penalty=0.2, presence_penalty=0.1, logprobs=2, min_tokens=4,
                             stop_token_ids=[7], stop=["w9 w9"], max_tokens=24),
              SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)]
    first = llm.generate(prompts()[:2], params, use_tqdm=False)
    again = llm.generate(prompts()[2:4] + prompts()[:1], params[1:] * 2 + params[:1], use_tqdm=False)
    assert again[-1]["token_ids"] == first[0]["token_ids"]
    assert len(first[0]["logprobs"]) == len(first[0]["token_ids"])
    assert first[0]["finish_reason"] in ("stop", "length") and first[1]["finish_reason"] == "length"


@pytest.fixture(scope="module")
def qwen3_06b_shape_dir(tmp_path_factory):
    """config.json of the Qwen3-0.6B shape with a stand-in tokenizer, for dummy weights."""
    path = tmp_path_factory.mktemp("qwen3-0.6b-shape")
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "hidden_act": "silu", "attention_bias": False, "eos_token_id": 1,
    }
    (path / "config.json").write_text(json.dumps(config))
    save_tiny_tokenizer(path)
    return str(path)


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
