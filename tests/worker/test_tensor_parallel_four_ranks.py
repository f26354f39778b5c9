"""Tensor parallelism with N=4 over CPU processes (gloo): greedy tokens equal transformers' on tiny models
whose every split dimension four ranks divide, a dense Qwen3 and a Qwen3.5 with experts (Gated DeltaNet
and gated attention layers, routed and shared experts); and on models of two KV heads, which four ranks
hold one each, repeated: Qwen2 (q/k/v biases), Phi-3 (q|k|v in one tensor), Gemma 3 (sliding and global
layers), Mixtral (experts) and gpt-oss (sinks, biased experts)."""

import pytest
from transformers import Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from helpers.family_checks import GREEDY, greedy
from helpers.gemma_models import save_gemma3
from helpers.hf_reference import hf_greedy
from helpers.moe_models import save_gpt_oss, save_mixtral
from helpers.prompts import random_prompts
from helpers.qwen3_5_models import save_qwen3_5_moe
from helpers.tiny_models import save_model

FOUR_KV_HEADS = dict(num_key_value_heads=4)  # the tiny models' other attention and MLP widths divide by four
PROMPTS = random_prompts([3, 20, 45])


@pytest.mark.slow
@pytest.mark.parametrize(
    "save",
    [
        lambda path: save_model(path, Qwen3Config, Qwen3ForCausalLM, **FOUR_KV_HEADS),
        lambda path: save_qwen3_5_moe(path, **FOUR_KV_HEADS, linear_num_key_heads=4, linear_num_value_heads=8),
    ],
    ids=["qwen3", "qwen3.5-moe"],
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
        save_gemma3,
        save_mixtral,
        save_gpt_oss,
    ],
    ids=["qwen2-q-k-v-biases", "phi3-fused-q-k-v", "gemma3-sliding-and-global", "mixtral", "gpt-oss-sinks"],
)
def test_four_ranks_repeat_two_kv_heads_and_match_transformers(tmp_path, save):
    # 2 KV heads for 4 ranks: each rank holds one, the query heads of its group split between two ranks
    model_dir = save(tmp_path / "model")
    expected = hf_greedy(model_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(model_dir, PROMPTS, tensor_parallel_size=4, device="cpu") == expected
