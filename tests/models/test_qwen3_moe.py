"""Qwen3-MoE against transformers' own Qwen3MoeForCausalLM on a tiny random model with a dense first layer
and three of eight experts, two per token: greedy tokens for prompts of mixed lengths, with prefix-cache
hits, in small prefill chunks and at two ranks, from one checkpoint tensor per expert (what transformers
writes) and from stacked experts (how it holds them)."""

import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from nanovllm import LLM
from nanovllm.config import Config
from nanovllm.models import model_class
from nanovllm.utils.loader import load_dummy_weights
from nanovllm.utils.parallel import tensor_parallel

from helpers.engine_probes import record_preemptions
from helpers.family_checks import ENGINE, GREEDY, greedy
from helpers.hf_reference import hf_greedy
from helpers.moe_models import PROMPTS, save_moe, save_qwen3_moe, save_stacked, tensor_names


@pytest.fixture(scope="module")
def qwen3_moe_dir(tmp_path_factory):
    return save_qwen3_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"))


@pytest.fixture(scope="module")
def expected(qwen3_moe_dir):
    return hf_greedy(qwen3_moe_dir, PROMPTS, GREEDY.max_tokens)


def test_the_checkpoint_holds_one_tensor_per_expert_and_a_dense_first_layer(qwen3_moe_dir):
    names = tensor_names(qwen3_moe_dir)
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in names and "model.layers.1.mlp.gate.weight" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names and not any(".layers.0.mlp.experts." in n for n in names)
    assert Config(qwen3_moe_dir).model_config.moe_layers == (1, 2, 3)


def test_greedy_matches_transformers(qwen3_moe_dir, expected):
    assert greedy(qwen3_moe_dir, PROMPTS) == expected


def test_prefill_chunks_beside_decodes_match_transformers(qwen3_moe_dir, expected):
    # 16-token steps: prompts are absorbed in chunks while the earlier ones decode in the same step
    assert greedy(qwen3_moe_dir, PROMPTS, max_num_batched_tokens=16) == expected


def test_prompts_with_a_cached_prefix_match_transformers(qwen3_moe_dir, expected):
    # the 70-token prompt shares four 16-token blocks with its copy run first
    llm = LLM(qwen3_moe_dir, **ENGINE)
    llm.generate([PROMPTS[3][:64] + [5]], GREEDY, use_tqdm=False)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.close()
    assert [o.num_cached_tokens for o in outputs] == [0, 0, 0, 64]
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_preempted_sequences_resume_with_the_tokens_of_transformers(qwen3_moe_dir, expected):
    # 8 blocks of 16 tokens cannot hold the four sequences at their full lengths (15 blocks)
    # admitted while prompts fit (no room kept for decoding), they outgrow the pool
    llm = LLM(qwen3_moe_dir, **{**ENGINE, "num_kvcache_blocks": 8, "schedule_conservativeness": 0})
    preempted = record_preemptions(llm)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.close()
    assert preempted
    assert [o.outputs[0].token_ids for o in outputs] == expected


@pytest.mark.slow
def test_two_ranks_equal_one(qwen3_moe_dir, expected):
    # each rank holds half of every expert's width; the router is the same on both
    assert greedy(qwen3_moe_dir, PROMPTS, tensor_parallel_size=2, device="cpu") == expected


def test_stacked_experts_load_and_give_the_same_tokens(qwen3_moe_dir, expected, tmp_path):
    stacked = save_stacked(qwen3_moe_dir, tmp_path / "stacked")
    names = tensor_names(stacked)
    assert "model.layers.1.mlp.experts.gate_up_proj" in names and not any(".experts.0." in n for n in names)
    assert greedy(stacked, PROMPTS) == expected


def test_renormalising_off_matches_transformers(tmp_path):
    # norm_topk_prob False (transformers' default): the chosen experts keep their softmax probabilities
    model_dir = save_moe(
        tmp_path / "unnormalised",
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    )
    assert not Config(model_dir).model_config.norm_topk_prob
    assert greedy(model_dir, PROMPTS[:2]) == hf_greedy(model_dir, PROMPTS[:2], GREEDY.max_tokens)


def test_a_missing_experts_tensor_is_named(qwen3_moe_dir, tmp_path):
    tensors = load_file(os.path.join(qwen3_moe_dir, "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes(open(os.path.join(qwen3_moe_dir, name), "rb").read())
    with pytest.raises(ValueError, match=r"missing weights: model\.layers\.2\.mlp\.experts\.w13\[\(5, 'up'\)\]$"):
        LLM(str(tmp_path), **ENGINE)


def test_dummy_weights_give_each_rank_its_slice_of_the_same_whole_experts(qwen3_moe_dir):
    model_config = Config(qwen3_moe_dir).model_config

    def experts(rank: int, size: int):
        with tensor_parallel(rank, size):
            model = model_class(model_config)(model_config)
        load_dummy_weights(model, model_config, seed=5)
        return model.model.layers[1].mlp.experts

    whole = experts(0, 1)
    gate, up = whole.w13.chunk(2, dim=1)
    for rank in (0, 1):
        part = experts(rank, 2)
        assert torch.equal(part.w13, torch.cat([gate.chunk(2, dim=1)[rank], up.chunk(2, dim=1)[rank]], dim=1))
        assert torch.equal(part.w2, whole.w2.chunk(2, dim=2)[rank])
