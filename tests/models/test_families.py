"""Qwen2, Mistral, Phi-3 and the rotary scalings (linear, yarn): token-exact greedy against transformers'
own class on a tiny random model of each, and the rotary tables against transformers' rotary embedding."""

import random

import pytest
import torch
from conftest import _common_config, save_tiny_tokenizer
from hf_reference import hf_greedy
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

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config
from nanovllm.layers.rotary_embedding import RotaryEmbedding
from nanovllm.models.model_config import ModelConfig

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ENGINE = dict(kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256)


def save_model(path, config_class, model_class, randomize_biases: bool = False, **fields) -> str:
    torch.manual_seed(0)
    model = model_class(config_class(**{**_common_config(), **fields}))
    if randomize_biases:  # transformers starts biases at zero, which would hide a bias left out
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.data.normal_(0.0, 0.5)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    return str(path)


def random_prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in lengths]


def greedy(model_dir: str, prompts, **engine) -> list[list[int]]:
    llm = LLM(model_dir, **{**ENGINE, **engine})
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    llm.close()
    return [o.outputs[0].token_ids for o in outputs]


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


def test_phi3_from_its_fused_q_k_v_and_gate_up_tensors_matches_transformers(tmp_path):
    model_dir = save_model(tmp_path / "phi3", Phi3Config, Phi3ForCausalLM)
    prompts = random_prompts([3, 20, 45])
    expected = hf_greedy(model_dir, prompts, GREEDY.max_tokens)
    assert greedy(model_dir, prompts) == expected
    # two ranks each take their heads' slices of q, k and v (and of gate and up) from the fused tensors
    assert greedy(model_dir, prompts, tensor_parallel_size=2, device="cpu") == expected


def test_a_partial_rotary_factor_is_refused(tmp_path):
    model_dir = save_model(
        tmp_path / "phi3", Phi3Config, Phi3ForCausalLM, partial_rotary_factor=0.75, architectures=["Phi3ForCausalLM"]
    )
    with pytest.raises(ValueError, match="partial_rotary_factor 0.75 is not supported"):
        LLM(model_dir, **ENGINE)


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
        **{**_common_config(max_positions=512), "rope_parameters": dict(scaling), "architectures": ["LlamaForCausalLM"]}
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
