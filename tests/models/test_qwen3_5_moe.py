"""Qwen3.5-MoE against transformers' own Qwen3_5MoeForCausalLM on a tiny random model (Qwen3.5's three Gated
DeltaNet layers to one gated full-attention layer, twice, each with eight experts of which two run per token
and a shared expert scaled by its sigmoid gate): the config's fields; the shared expert gives transformers'
output and, split over two ranks, adds up to the whole; and the engine's greedy tokens equal transformers' in
small prefill chunks, in a second turn read from the prefix cache, from stacked experts, from an image-text
checkpoint and at two ranks."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

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
from helpers.moe_models import save_stacked, tensor_names
from helpers.prompts import random_prompts
from helpers.qwen3_5_models import (
    LAYER_TYPES,
    WIDER_SHARED_EXPERT,
    save_qwen3_5_moe,
    save_qwen3_5_moe_image_text,
)

PROMPTS = random_prompts([5, 20, 45], seed=6)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return save_qwen3_5_moe(tmp_path_factory.mktemp("tiny-qwen3_5-moe"))


@pytest.fixture(scope="module")
def model_config(moe_dir) -> ModelConfig:
    return ModelConfig.from_hf(AutoConfig.from_pretrained(moe_dir))


@pytest.fixture(scope="module")
def wider_dir(tmp_path_factory):
    return save_qwen3_5_moe(tmp_path_factory.mktemp("tiny-qwen3_5-moe-wider"), **WIDER_SHARED_EXPERT)


@pytest.fixture(scope="module")
def expected(moe_dir):
    return hf_greedy(moe_dir, PROMPTS, GREEDY.max_tokens)


def test_the_config_puts_experts_and_a_shared_expert_in_every_layer(model_config):
    assert model_config.layer_types == tuple(LAYER_TYPES)
    assert model_config.moe_layers == tuple(range(len(LAYER_TYPES)))
    assert (model_config.num_experts, model_config.num_experts_per_tok) == (8, 2)
    assert (model_config.moe_intermediate_size, model_config.shared_expert_intermediate_size) == (32, 32)
    assert model_config.norm_topk_prob and model_config.attn_output_gate and model_config.rotary_dim == 4


def test_transformers_defaults_and_ours_agree():
    hf = Qwen3_5MoeTextConfig(architectures=["Qwen3_5MoeForCausalLM"])
    ours = ModelConfig.from_hf(SimpleNamespace(architectures=hf.architectures))
    assert ModelConfig.from_hf(hf) == ours
    assert (ours.num_experts, ours.num_experts_per_tok, ours.shared_expert_intermediate_size) == (256, 8, 512)


def test_other_families_with_a_shared_expert_are_still_refused():
    config = SimpleNamespace(architectures=["Qwen3MoeForCausalLM"], shared_expert_intermediate_size=64)
    with pytest.raises(ValueError, match="shared_expert_intermediate_size=64 is not supported"):
        ModelConfig.from_hf(config)


def test_an_image_text_config_reads_its_text_config():
    text_config = SimpleNamespace(num_hidden_layers=2, full_attention_interval=2, shared_expert_intermediate_size=96)
    config = ModelConfig.from_hf(
        SimpleNamespace(architectures=["Qwen3_5MoeForConditionalGeneration"], text_config=text_config)
    )
    assert config.moe_layers == (0, 1) and config.shared_expert_intermediate_size == 96
    assert config.checkpoint_names.prefixes["model.language_model."] == "model."


def hf_first_mlp(model_dir):
    return Qwen3_5MoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32).model.layers[0].mlp


def first_mlps(model_dir, ranks_of: list[tuple[int, int]]) -> list:
    """The first layer's MoE block of the engine's model, loaded as each (rank, ranks) of `ranks_of`."""
    config = ModelConfig.from_hf(AutoConfig.from_pretrained(model_dir))
    mlps = []
    for rank, ranks in ranks_of:
        with tensor_parallel(rank, ranks):
            model = DecoderForCausalLM(config)
            load_model(model, model_dir)
        mlps.append(model.model.layers[0].mlp)
    return mlps


def test_a_wider_shared_expert_gives_transformers_output_and_its_rank_parts_add_up(wider_dir):
    """sigmoid(shared_expert_gate(y)) * shared_expert(y) of transformers' first layer; each rank's unsummed
    part (half the width, the whole gate) sums to it."""
    torch.manual_seed(0)
    y = torch.randn(5, 64)
    hf_mlp = hf_first_mlp(wider_dir)
    with torch.inference_mode():
        want = hf_mlp.shared_expert_gate(y).sigmoid() * hf_mlp.shared_expert(y)
        whole, *parts = [mlp.shared_expert(y) for mlp in first_mlps(wider_dir, [(0, 1), (0, 2), (1, 2)])]
    torch.testing.assert_close(whole, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sum(parts), whole, atol=1e-5, rtol=1e-5)


def test_a_shared_expert_as_wide_as_the_experts_runs_in_their_last_slot(moe_dir):
    """Once loaded, the shared expert is the experts' last slot (each rank its half of the width) and its
    gate the router's last row; the block's output is transformers' routed and shared experts' sum."""
    torch.manual_seed(0)
    y = torch.randn(5, 64)
    hf_mlp = hf_first_mlp(moe_dir)
    hf_shared = hf_mlp.shared_expert
    down = hf_shared.down_proj.weight
    ranks_of = [(0, 1), (0, 2), (1, 2)]
    mlps = first_mlps(moe_dir, ranks_of)
    for mlp, (rank, ranks) in zip(mlps, ranks_of):
        assert mlp.shared_expert is None and mlp.experts.w13.size(0) == 9 and mlp.gate.weight.size(0) == 9
        gate, up = (w.chunk(ranks)[rank] for w in (hf_shared.gate_proj.weight, hf_shared.up_proj.weight))
        torch.testing.assert_close(mlp.experts.w13[-1], torch.cat([gate, up]), atol=0, rtol=0)
        torch.testing.assert_close(mlp.experts.w2[-1], down.chunk(ranks, 1)[rank], atol=0, rtol=0)
        torch.testing.assert_close(mlp.gate.weight[-1:], hf_mlp.shared_expert_gate.weight, atol=0, rtol=0)
    with torch.inference_mode():
        want = hf_mlp(y[None])
        got = mlps[0].experts(y, mlps[0].gate(y))
    want = want[0] if isinstance(want, tuple) else want  # [1, 5, hidden]
    torch.testing.assert_close(got, want[0], atol=1e-5, rtol=1e-5)


def test_greedy_tokens_in_small_prefill_chunks_equal_transformers(moe_dir, expected):
    assert greedy(moe_dir, PROMPTS, max_num_batched_tokens=16) == expected


def test_a_second_turn_reads_the_first_from_the_prefix_cache(moe_dir):
    assert_second_turn_matches_transformers(moe_dir)


def test_preempted_requests_resume_with_transformers_tokens(moe_dir):
    assert_preempted_requests_match_transformers(moe_dir)


def test_stacked_experts_load_and_give_the_same_tokens(moe_dir, expected, tmp_path):
    stacked = save_stacked(moe_dir, tmp_path / "stacked")
    names = tensor_names(stacked)
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and not any(".experts.0." in n for n in names)
    assert greedy(stacked, PROMPTS) == expected


def test_a_wider_shared_expert_gives_transformers_tokens(wider_dir):
    assert greedy(wider_dir, PROMPTS) == hf_greedy(wider_dir, PROMPTS, GREEDY.max_tokens)


def test_an_image_text_checkpoint_runs_as_its_language_model(tmp_path):
    model_dir = save_qwen3_5_moe_image_text(tmp_path / "image-text")
    assert greedy(model_dir, PROMPTS) == hf_greedy(model_dir, PROMPTS, GREEDY.max_tokens)


@pytest.mark.slow
def test_two_ranks_equal_transformers(moe_dir, expected):
    # each rank holds half of every expert's width and of the shared expert's; one all-reduce sums both
    assert greedy(moe_dir, PROMPTS, tensor_parallel_size=2, device="cpu") == expected


@pytest.mark.gpu
def test_the_fused_kernels_give_transformers_tokens_on_the_gpu(moe_dir, expected, wider_dir):
    """On CUDA the experts run in the fused kernels (one-sequence decode steps in the few-token ones), the
    shared expert in their last slot or, wider, beside them; prompts whole and cut every 16 tokens, decode
    steps in CUDA graphs."""
    assert greedy(moe_dir, PROMPTS, device="cuda") == expected
    assert greedy(moe_dir, PROMPTS[:1], device="cuda") == expected[:1]
    assert greedy(moe_dir, PROMPTS, device="cuda", max_num_batched_tokens=16) == expected
    wider_expected = hf_greedy(wider_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(wider_dir, PROMPTS, device="cuda") == wider_expected
    assert greedy(wider_dir, PROMPTS[:1], device="cuda") == wider_expected[:1]
