"""Qwen2, Mistral, Phi-3 and the rotary scalings (linear, yarn): token-exact greedy against transformers'
own class on a tiny random model of each, and the rotary tables against transformers' rotary embedding."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from nanovllm.config import Config
from nanovllm.layers.rotary_embedding import RotaryEmbedding
from nanovllm.models.model_config import ModelConfig

from helpers.family_checks import (
    GREEDY,
    assert_matches_transformers,
    greedy,
    prompts_with_a_shared_prefix,
)
from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts
from helpers.tiny_models import save_model, tiny_config


@pytest.mark.slow
def test_qwen2_with_its_q_k_v_biases_matches_transformers(tmp_path):
    model_dir = save_model(tmp_path / "qwen2", Qwen2Config, Qwen2ForCausalLM, randomize_biases=True)
    prompts = random_prompts([3, 20, 45])
    expected = hf_greedy(model_dir, prompts, GREEDY.max_tokens)
    assert greedy(model_dir, prompts) == expected
    # two ranks split the q, k and v biases with their heads
    assert greedy(model_dir, prompts, tensor_parallel_size=2, device="cpu") == expected


@pytest.mark.parametrize("window", [None, 96])
def test_mistral_matches_transformers_within_its_window(tmp_path, window):
    model_dir = save_model(tmp_path / "mistral", MistralConfig, MistralForCausalLM, sliding_window=window)
    prompts = random_prompts([4, 30, 60])  # up to 84 tokens: inside a 96-token window
    assert greedy(model_dir, prompts, max_model_len=96) == hf_greedy(model_dir, prompts, GREEDY.max_tokens)


@pytest.mark.slow
def test_phi3_from_its_fused_q_k_v_and_gate_up_tensors_matches_transformers(tmp_path):
    model_dir = save_model(tmp_path / "phi3", Phi3Config, Phi3ForCausalLM)
    prompts = random_prompts([3, 20, 45])
    expected = hf_greedy(model_dir, prompts, GREEDY.max_tokens)
    assert greedy(model_dir, prompts) == expected
    # two ranks each take their heads' slices of q, k and v (and of gate and up) from the fused tensors
    assert greedy(model_dir, prompts, tensor_parallel_size=2, device="cpu") == expected


@pytest.mark.slow
def test_phi4_mini_partial_rotary_matches_transformers(tmp_path):
    # Phi-4-mini turns the first 0.75 of each head (12 of 16 here) and passes the rest through
    model_dir = save_model(tmp_path / "phi4", Phi3Config, Phi3ForCausalLM, partial_rotary_factor=0.75)
    assert ModelConfig.from_hf(Phi3Config.from_pretrained(model_dir)).rotary_dim == 12
    assert_matches_transformers(model_dir, prompts_with_a_shared_prefix())


@pytest.mark.parametrize(
    "config_class, model_class",
    [(MistralConfig, MistralForCausalLM), (Phi3Config, Phi3ForCausalLM)],
    ids=["mistral", "phi3"],
)
def test_a_context_longer_than_the_sliding_window_matches_transformers(tmp_path, config_class, model_class):
    # every layer attends over 24 tokens; prompts and their 24 new tokens run past it
    model_dir = save_model(tmp_path / "model", config_class, model_class, sliding_window=24)
    prompts = random_prompts([10, 30, 60])
    assert greedy(model_dir, prompts) == hf_greedy(model_dir, prompts, GREEDY.max_tokens)


def test_flash_attn_which_gets_no_window_is_refused_past_the_window(tmp_path, monkeypatch):
    model_dir = save_model(tmp_path / "mistral", MistralConfig, MistralForCausalLM, sliding_window=96)
    monkeypatch.setattr(Config, "_resolve_attention_backend", lambda self: "flash_attn")  # as on a GPU with it
    with pytest.raises(ValueError, match="'flash_attn' cannot apply this model's sliding window of 96 tokens"):
        Config(model_dir, max_model_len=256)
    assert Config(model_dir, max_model_len=96).attention_impl == "flash_attn"  # the window changes nothing


SCALINGS = [
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32},
    {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 16,
        "beta_slow": 2,
        "truncate": False,
        "mscale": 1.2,
        "mscale_all_dim": 0.8,
    },
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=["linear", "yarn", "yarn-mscale"])
def test_rotary_tables_equal_transformers_beyond_the_original_context(scaling):
    hf = LlamaConfig(
        **{**tiny_config(max_positions=512), "rope_parameters": dict(scaling), "architectures": ["LlamaForCausalLM"]}
    )
    ours = RotaryEmbedding(16, 512, ModelConfig.from_hf(hf).rope_parameters)
    positions = torch.arange(512)
    cos, sin = LlamaRotaryEmbedding(hf)(torch.zeros(1, 512, 16), positions[None])
    torch.testing.assert_close(ours.cos_sin[:, 0], cos[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.cos_sin[:, 1], sin[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scaling", SCALINGS[:2], ids=["linear", "yarn"])
def test_scaled_rotary_models_match_transformers_past_the_original_context(tmp_path, scaling):
    model_dir = save_model(tmp_path / "llama", LlamaConfig, LlamaForCausalLM, rope_parameters=dict(scaling))
    prompts = random_prompts([10, 50])  # positions up to 73, past yarn's original 32
    assert greedy(model_dir, prompts) == hf_greedy(model_dir, prompts, GREEDY.max_tokens)


def longrope(n: int, **extra) -> dict:
    """LongRoPE parameters with n distinct short factors (near 1) and long ones (2 to 9)."""
    short = [1.0 + 0.05 * i for i in range(n)]
    long = [2.0 + 7.0 * i / (n - 1) for i in range(n)]
    return {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long, **extra}


# Phi-3 configs past a 32-token original context (128 positions): LongRoPE over whole heads (Phi-3.5-mini),
# over 0.75 of each head with a given attention factor (Phi-4-mini's shape), and a partial rotary alone
PHI3_ROTARIES = {
    "longrope": dict(rope_parameters=longrope(8)),
    "longrope-partial": dict(partial_rotary_factor=0.75, rope_parameters=longrope(6, attention_factor=1.3)),
    "partial": dict(partial_rotary_factor=0.75),
}


@pytest.mark.parametrize("fields", PHI3_ROTARIES.values(), ids=PHI3_ROTARIES.keys())
def test_phi3_rotary_tables_equal_transformers_short_within_and_long_past_the_original_context(fields):
    hf = Phi3Config(
        **{**tiny_config(max_positions=128), "original_max_position_embeddings": 32, **fields},
        architectures=["Phi3ForCausalLM"],
    )
    config = ModelConfig.from_hf(hf)
    ours = RotaryEmbedding(16, 128, config.rope_parameters, config.rotary_dim).cos_sin
    reference = Phi3RotaryEmbedding(hf)
    # transformers rotates a pass over positions below 32 with the short factors, one that reaches
    # past them with the long ones throughout: each half of our table against the pass it matches
    short = reference(torch.zeros(1), torch.arange(32)[None])
    long = reference(torch.zeros(1), torch.arange(128)[None])
    for i, (within, past) in enumerate(zip(short, long)):
        assert within.shape[-1] == config.rotary_dim
        torch.testing.assert_close(ours[:32, i], within[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours[32:, i], past[0, 32:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("partial_rotary_factor", [1.0, 0.75], ids=["phi3.5-mini", "phi4-mini"])
@pytest.mark.slow
def test_phi3_longrope_matches_transformers_within_the_original_context(tmp_path, partial_rotary_factor):
    # prompts of up to 36 tokens and 24 generated: every position below the 64-token original context, where
    # transformers too rotates with the short factors (past it, it re-encodes the whole sequence with the
    # long ones, which a paged cache does not: see rotary_embedding._longrope_angles)
    model_dir = save_model(
        tmp_path / "phi3",
        Phi3Config,
        Phi3ForCausalLM,
        max_position_embeddings=256,
        original_max_position_embeddings=64,
        partial_rotary_factor=partial_rotary_factor,
        rope_parameters=longrope(int(16 * partial_rotary_factor) // 2),
    )
    rope = ModelConfig.from_hf(Phi3Config.from_pretrained(model_dir)).rope_parameters
    assert (rope["rope_type"], rope["original_max_position_embeddings"], rope["factor"]) == ("longrope", 64, 4.0)
    assert_matches_transformers(model_dir, prompts_with_a_shared_prefix())
