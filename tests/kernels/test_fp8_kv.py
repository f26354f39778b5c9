"""The FP8 KV cache: its number format, the capacity it gives, and an engine running on it (CPU, and GPU
where there is one)."""

import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.default_model import chat_prompt
from nanovllm.kernels.fp8_kv import FP8_DTYPE, FP8_MAX, dequantize_heads, quantize_heads, round_trip

from helpers.engine_probes import engine, record_preemptions
from helpers.prompts import random_prompts, token_ids

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)


def test_each_head_spans_the_fp8_range_and_comes_back_within_its_precision():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 64) * torch.tensor([1e-3, 1.0, 300.0])[None, :, None]  # heads of very different size
    x[4, 2] = 0
    values, scales = quantize_heads(x)
    assert values.dtype == FP8_DTYPE and scales.shape == (5, 3) and scales.dtype == torch.float32
    assert torch.equal(values[:4].float().abs().amax(-1), torch.full((4, 3), FP8_MAX))
    assert scales[4, 2] == 1 and not values[4, 2].float().any()
    back = dequantize_heads(values, scales, torch.float32)
    # e4m3 keeps 3 mantissa bits: at most half a step, 2**-4 of the value, for normal values
    assert ((back - x).abs() <= 2**-4 * x.abs() + scales.unsqueeze(-1) * 2**-10).all()
    assert torch.equal(round_trip(x), back)


@pytest.mark.parametrize("device", DEVICES)
def test_preemption_and_prefix_hits_give_the_outputs_of_fresh_engines(qwen3_dir, device):
    # on an FP8 cache a prompt attends the quantized keys, whether its prefix was cached, recomputed after
    # preemption, or computed in the same step, so all three give the same greedy tokens
    shared = random_prompts([48], seed=23)[0]
    prompts = [shared + p for p in random_prompts([2, 9, 20, 5, 13, 1], seed=24)]
    # admitted while prompts fit (no room kept for decoding), the requests outgrow the pool
    crowded = engine(qwen3_dir, device=device, kv_cache_dtype="fp8", num_kvcache_blocks=14, schedule_conservativeness=0)
    preempted = record_preemptions(crowded)
    outputs = crowded.generate(prompts, GREEDY, use_tqdm=False)
    assert preempted and any(o.num_cached_tokens for o in outputs)
    alone = [
        engine(qwen3_dir, device=device, kv_cache_dtype="fp8").generate([p], GREEDY, use_tqdm=False)[0] for p in prompts
    ]
    assert token_ids(outputs) == token_ids(alone)


def test_the_cache_holds_as_many_blocks_as_its_smaller_blocks_fit(qwen3_dir):
    hf = LLM(qwen3_dir, device="cpu", num_kvcache_blocks=1).config.model_config
    head_dim = hf.head_dim
    per_block_head = 2 * hf.num_hidden_layers * 16 * hf.num_key_value_heads  # K and V, every layer, 16 slots
    blocks = {}
    for dtype, head_bytes in (("auto", head_dim * 4), ("fp8", head_dim + 4)):  # fp32 values; fp8 values + scale
        llm = LLM(
            qwen3_dir,
            device="cpu",
            block_size=16,
            cpu_kvcache_gb=0.01,
            max_num_seqs=512,
            max_model_len=1024,
            kv_cache_dtype=dtype,
        )
        blocks[dtype] = llm.client.info.num_kvcache_blocks
        assert blocks[dtype] == int(0.01 * (1 << 30)) // (per_block_head * head_bytes)
    assert blocks["fp8"] > 2.5 * blocks["auto"]


@pytest.mark.slow
def test_bundled_model_answers_as_with_a_full_precision_cache(smollm_dir):
    # FP8 keys move the scores of this 135M model enough to change later greedy picks (see the issue's
    # note: 2 of 16 completions identical over 64 tokens); the first tokens and the facts hold
    questions = [
        "What is the capital of France?",
        "Name three primary colors.",
        "What is 12 times 7?",
        "What does DNA stand for?",
    ]
    runs = {}
    for dtype in ("auto", "fp8"):
        llm = LLM(smollm_dir, block_size=16, num_kvcache_blocks=64, max_model_len=512, kv_cache_dtype=dtype)
        prompts = [chat_prompt(llm.tokenizer, q) for q in questions]
        runs[dtype] = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    assert [o.outputs[0].token_ids[0] for o in runs["fp8"]] == [o.outputs[0].token_ids[0] for o in runs["auto"]]
    assert "Paris" in runs["fp8"][0].outputs[0].text


@pytest.mark.slow
def test_chunked_prefill_and_two_ranks_give_the_outputs_of_one_whole_prefill(qwen3_dir):
    prompts = random_prompts([150, 7, 61], seed=31)
    whole = engine(
        qwen3_dir, device="cpu", kv_cache_dtype="fp8", enable_chunked_prefill=False, max_num_batched_tokens=256
    ).generate(prompts, GREEDY, use_tqdm=False)
    chunked = engine(qwen3_dir, device="cpu", kv_cache_dtype="fp8", max_num_batched_tokens=32)
    assert token_ids(chunked.generate(prompts, GREEDY, use_tqdm=False)) == token_ids(whole)
    split = engine(qwen3_dir, device="cpu", kv_cache_dtype="fp8", tensor_parallel_size=2)
    try:
        assert token_ids(split.generate(prompts, GREEDY, use_tqdm=False)) == token_ids(whole)
    finally:
        split.close()
