"""Qwen3-Next against transformers' own Qwen3NextForCausalLM on a tiny random model (Gated DeltaNet and gated
full-attention layers, two of each; experts with a shared expert in three layers, a dense MLP in the fourth
(mlp_only_layers); the router's top-k weights not renormalised): the config's fields; each rank loads its
heads' rows of the per-key-head grouped in_proj_qkvz and in_proj_ba into the fused projection, and skips the
multi-token-prediction head; the engine's greedy tokens equal transformers' for prompts of mixed lengths,
whole and in small prefill chunks, in a second turn read from the prefix cache, through preemption and at
two ranks."""

import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, Qwen3NextConfig, Qwen3NextForCausalLM

from nanovllm.models.blocks import DecoderForCausalLM
from nanovllm.models.model_config import ModelConfig
from nanovllm.utils.loader import load_model
from nanovllm.utils.parallel import tensor_parallel

from helpers.family_checks import (
    GREEDY,
    assert_preempted_requests_match_transformers,
    assert_second_turn_matches_transformers,
    greedy,
)
from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts
from helpers.qwen3_next_models import DENSE_LAYER, FIELDS, LAYER_TYPES, save_qwen3_next

PROMPTS = random_prompts([5, 20, 45], seed=6)


@pytest.fixture(scope="module")
def next_dir(tmp_path_factory):
    return save_qwen3_next(tmp_path_factory.mktemp("tiny-qwen3-next"))


@pytest.fixture(scope="module")
def model_config(next_dir) -> ModelConfig:
    return ModelConfig.from_hf(AutoConfig.from_pretrained(next_dir))


@pytest.fixture(scope="module")
def expected(next_dir):
    return hf_greedy(next_dir, PROMPTS, GREEDY.max_tokens)


def test_the_config_names_the_layers_their_experts_and_the_router(model_config):
    assert model_config.layer_types == tuple(LAYER_TYPES)
    assert model_config.moe_layers == tuple(i for i in range(len(LAYER_TYPES)) if i != DENSE_LAYER)
    assert (model_config.num_experts, model_config.num_experts_per_tok) == (8, 2)
    assert (model_config.moe_intermediate_size, model_config.shared_expert_intermediate_size) == (32, 32)
    assert not model_config.norm_topk_prob  # read from the config, which Qwen3.5-MoE's class ignores
    assert model_config.attn_output_gate and model_config.qk_norm and model_config.norm_unit_offset
    assert model_config.rotary_dim == 4 and model_config.linear_num_value_heads == 4


def test_transformers_defaults_and_ours_agree():
    hf = Qwen3NextConfig(architectures=["Qwen3NextForCausalLM"])
    ours = ModelConfig.from_hf(SimpleNamespace(architectures=hf.architectures))
    assert ModelConfig.from_hf(hf) == ours
    assert (ours.num_experts, ours.num_experts_per_tok, ours.shared_expert_intermediate_size) == (512, 10, 512)
    assert ours.norm_topk_prob and ours.moe_layers == tuple(range(48)) and ours.rotary_dim == 64
    assert ours.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)


def _shards_over_all_heads(hf_layer) -> dict[str, torch.Tensor]:
    """transformers' q, k, v, z, b and a rows [heads * rows per head, hidden] of a Gated DeltaNet, each shard's
    rows over all its heads, cut from the per-key-head groups of in_proj_qkvz and in_proj_ba."""
    keys, values = hf_layer.num_k_heads, hf_layer.num_v_heads
    per_key = values // keys  # the value heads that read each key head
    dk, dv = hf_layer.head_k_dim, hf_layer.head_v_dim
    qkvz = hf_layer.in_proj_qkvz.weight.view(keys, 2 * dk + 2 * per_key * dv, -1)
    ba = hf_layer.in_proj_ba.weight.view(keys, 2 * per_key, -1)
    q, k, v, z = qkvz.split([dk, dk, per_key * dv, per_key * dv], dim=1)
    b, a = ba.split([per_key, per_key], dim=1)
    return {name: t.flatten(0, 1) for name, t in dict(q=q, k=k, v=v, z=z, b=b, a=a).items()}


def test_each_rank_loads_its_heads_rows_of_the_grouped_projections(next_dir, model_config):
    """The fused projections of a rank of one or two hold, shard after shard, the rank's half of every shard's
    rows as transformers cuts them from its grouped tensors (key heads 0 and 1, value heads 0-1 and 2-3)."""
    hf_layer = Qwen3NextForCausalLM.from_pretrained(next_dir, dtype=torch.float32).model.layers[0].linear_attn
    shards = _shards_over_all_heads(hf_layer)
    for rank, ranks in [(0, 1), (0, 2), (1, 2)]:
        with tensor_parallel(rank, ranks):
            model = DecoderForCausalLM(model_config)
            load_model(model, next_dir)
        layer = model.model.layers[0].linear_attn
        got = torch.cat([layer.in_proj_qkvz.weight, layer.in_proj_ba.weight])
        want = torch.cat([t.chunk(ranks)[rank] for t in shards.values()])
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_the_multi_token_prediction_head_is_not_loaded(next_dir, model_config, tmp_path):
    model_dir = shutil.copytree(next_dir, tmp_path / "with-mtp")
    save_file({"mtp.fc.weight": torch.ones(64, 128), "mtp.norm.weight": torch.ones(64)}, model_dir / "mtp.safetensors")
    model = DecoderForCausalLM(model_config)
    load_model(model, str(model_dir))
    assert not any(name.startswith("mtp") for name, _ in model.named_parameters())


def test_greedy_tokens_of_mixed_length_prompts_whole_and_in_small_chunks_equal_transformers(next_dir, expected):
    assert greedy(next_dir, PROMPTS) == expected
    assert greedy(next_dir, PROMPTS, max_num_batched_tokens=16) == expected  # the 45-token prompt in three chunks


def test_a_second_turn_reads_the_first_from_the_prefix_cache(next_dir):
    assert_second_turn_matches_transformers(next_dir)


def test_preempted_requests_resume_with_transformers_tokens(next_dir):
    assert_preempted_requests_match_transformers(next_dir)


@pytest.mark.slow
def test_two_ranks_equal_transformers(next_dir, expected):
    # each rank holds one key head and two value heads of every Gated DeltaNet, half of every expert's width
    assert FIELDS["linear_num_key_heads"] == 2
    assert greedy(next_dir, PROMPTS, tensor_parallel_size=2, device="cpu") == expected


@pytest.mark.gpu
def test_the_kernels_give_transformers_tokens_on_the_gpu(next_dir, expected):
    """On CUDA the Gated DeltaNet runs in the Triton kernels and the experts in the fused ones: prompts whole
    and cut every 16 tokens, decode steps in CUDA graphs."""
    assert greedy(next_dir, PROMPTS, device="cuda") == expected
    assert greedy(next_dir, PROMPTS, device="cuda", max_num_batched_tokens=16) == expected
