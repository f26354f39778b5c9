"""Tensor parallelism with N=4 over CPU processes (gloo): greedy tokens equal transformers' on a tiny model of
every family. Those whose KV heads four ranks divide: Qwen3, Qwen3.5 with and without experts and Qwen3-Next
(Gated DeltaNet and gated attention layers, routed and shared experts), Gemma 4 (K = V global layers). Those of
two KV heads, which four ranks hold one each, repeated: Qwen2 (q/k/v biases), Phi-3 (q|k|v in one tensor),
Llama, Mistral (a window), Gemma 2 (soft caps), Gemma 3 (sliding and global layers), Qwen3-MoE, Mixtral and
gpt-oss (sinks, biased experts)."""

import pytest
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from helpers.family_checks import GREEDY, greedy
from helpers.gemma_models import save_gemma2, save_gemma3, save_gemma4_dense
from helpers.hf_reference import hf_greedy
from helpers.moe_models import save_gpt_oss, save_mixtral, save_qwen3_moe
from helpers.prompts import random_prompts
from helpers.qwen3_5_models import save_qwen3_5, save_qwen3_5_moe
from helpers.qwen3_next_models import save_qwen3_next
from helpers.tiny_models import save_model

FOUR_KV_HEADS = dict(num_key_value_heads=4)  # the tiny models' other attention and MLP widths divide by four
FOUR_LINEAR_HEADS = dict(linear_num_key_heads=4, linear_num_value_heads=8)  # Gated DeltaNet heads, likewise
PROMPTS = random_prompts([3, 20, 45])


@pytest.mark.slow
@pytest.mark.parametrize(
    "save",
    [
        lambda path: save_model(path, Qwen3Config, Qwen3ForCausalLM, **FOUR_KV_HEADS),
        lambda path: save_qwen3_5(path, **FOUR_KV_HEADS, **FOUR_LINEAR_HEADS),
        lambda path: save_qwen3_5_moe(path, **FOUR_KV_HEADS, **FOUR_LINEAR_HEADS),
        lambda path: save_qwen3_next(path, **FOUR_KV_HEADS, **FOUR_LINEAR_HEADS),
        lambda path: save_gemma4_dense(path, num_global_key_value_heads=4),
    ],
    ids=["qwen3", "qwen3.5", "qwen3.5-moe", "qwen3-next", "gemma4-k-eq-v"],
)
def test_four_ranks_match_transformers(tmp_path, save):
    model_dir = save(tmp_path / "model")
    expected = hf_greedy(model_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(model_dir, PROMPTS, tensor_parallel_size=4, device="cpu") == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    "save",
    [
        lambda path: save_model(path, Qwen2Config, Qwen2ForCausalLM, randomize_biases=True),
        lambda path: save_model(path, Phi3Config, Phi3ForCausalLM),
        lambda path: save_model(path, LlamaConfig, LlamaForCausalLM),
        lambda path: save_model(path, MistralConfig, MistralForCausalLM, sliding_window=24),
        save_gemma2,
        save_gemma3,
        save_qwen3_moe,
        save_mixtral,
        save_gpt_oss,
    ],
    ids=[
        "qwen2-q-k-v-biases",
        "phi3-fused-q-k-v",
        "llama",
        "mistral-window",
        "gemma2-soft-caps",
        "gemma3-sliding-and-global",
        "qwen3-moe",
        "mixtral",
        "gpt-oss-sinks",
    ],
)
def test_four_ranks_repeat_two_kv_heads_and_match_transformers(tmp_path, save):
    # 2 KV heads for 4 ranks: each rank holds one, the query heads of its group split between two ranks
    model_dir = save(tmp_path / "model")
    expected = hf_greedy(model_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(model_dir, PROMPTS, tensor_parallel_size=4, device="cpu") == expected
