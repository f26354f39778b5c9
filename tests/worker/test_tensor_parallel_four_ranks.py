"""Tensor parallelism with N=4 over CPU processes (gloo): greedy tokens equal transformers' on tiny models
whose every split dimension four ranks divide, a dense Qwen3 and a Qwen3.5 with experts (Gated DeltaNet
and gated attention layers, routed and shared experts)."""

import pytest
from transformers import Qwen3Config, Qwen3ForCausalLM

from helpers.family_checks import GREEDY, greedy
from helpers.hf_reference import hf_greedy
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
