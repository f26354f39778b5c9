"""Mixtral against transformers' own MixtralForCausalLM on a tiny random model of eight experts in every
layer, two per token: greedy tokens from its published tensor names (block_sparse_moe, w1/w2/w3), and
from transformers 5's stacked experts in 16-token prefill chunks, with prefix-cache hits and at two ranks;
with a sliding window that the prompts run past."""

import pytest

from nanovllm.config import Config

from helpers.family_checks import GREEDY, assert_matches_transformers, greedy, prompts_with_a_shared_prefix
from helpers.hf_reference import hf_greedy
from helpers.moe_models import PROMPTS, save_mixtral, save_stacked, tensor_names


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return save_mixtral(tmp_path_factory.mktemp("tiny-mixtral"))


def test_the_checkpoint_names_the_block_sparse_moe_and_its_experts_w1_w2_w3(mixtral_dir):
    names = tensor_names(mixtral_dir)
    assert "model.layers.1.block_sparse_moe.gate.weight" in names
    assert {f"model.layers.1.block_sparse_moe.experts.7.{w}.weight" for w in ("w1", "w2", "w3")} <= set(names)
    config = Config(mixtral_dir).model_config
    assert config.moe_layers == (0, 1) and config.norm_topk_prob


def test_greedy_matches_transformers(mixtral_dir):
    assert greedy(mixtral_dir, PROMPTS) == hf_greedy(mixtral_dir, PROMPTS, GREEDY.max_tokens)


@pytest.mark.slow
def test_stacked_experts_match_transformers_in_chunks_with_cached_prefixes_and_at_two_ranks(mixtral_dir, tmp_path):
    stacked = save_stacked(mixtral_dir, tmp_path / "stacked")
    assert "model.layers.1.mlp.experts.gate_up_proj" in tensor_names(stacked)
    assert_matches_transformers(stacked, prompts_with_a_shared_prefix())


def test_a_context_past_the_sliding_window_matches_transformers(tmp_path):
    # every layer attends over 24 tokens, as Mistral's; prompts and their 24 new tokens run past it
    model_dir = save_mixtral(tmp_path / "windowed", sliding_window=24)
    prompts = PROMPTS[1:3]
    assert greedy(model_dir, prompts) == hf_greedy(model_dir, prompts, GREEDY.max_tokens)
