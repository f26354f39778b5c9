"""Tiny mixture-of-experts models saved with transformers (a Mixtral and a Qwen3-MoE among them), the prompts
their tests share, a gpt-oss with MXFP4 experts, and the names of the tensors a checkpoint holds."""

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from nanovllm.kernels.mxfp4 import BLOCK, quantize

from helpers.prompts import random_prompts
from helpers.tiny_models import save_tiny_tokenizer, tiny_config

PROMPTS = random_prompts([3, 17, 40, 70])
# eight experts of width 32 (Mixtral's experts are intermediate_size wide), top-2
MIXTRAL_EXPERTS = dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32)


def save_moe(path, config_class, model_class, **fields) -> str:
    """A tiny random model of `model_class` in fp32, with its tokenizer; transformers writes each expert's
    weights as tensors of their own. The router starts at transformers' init spread (as every weight of
    `tiny_config`), enough that tokens of one batch go to different experts."""
    torch.manual_seed(0)
    model = model_class(config_class(**{**tiny_config(), **fields}))
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    return str(path)


def save_mixtral(path, **fields) -> str:
    """A tiny Mixtral of MIXTRAL_EXPERTS in every layer, with its published tensor names (block_sparse_moe,
    w1/w2/w3); `fields` add to its config."""
    return save_moe(path, MixtralConfig, MixtralForCausalLM, **MIXTRAL_EXPERTS, **fields)


def save_qwen3_moe(path) -> str:
    """A tiny Qwen3-MoE of four layers, the first dense (mlp_only_layers), the others with 8 experts of width
    32, top-2, renormalised (norm_topk_prob, as the published Qwen3-MoE checkpoints)."""
    return save_moe(
        path,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        num_hidden_layers=4,
        mlp_only_layers=[0],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    )


def save_gpt_oss(path, **fields) -> str:
    """A tiny gpt-oss of four layers, sliding (a 20-token window) and full in turn, 8 biased experts of width
    32, top-2, YaRN rotary as the published models have it (scaled 4x from 256 positions, not truncated);
    `fields` add to its config or replace them. Its sinks start at transformers' init spread, as every weight
    of `tiny_config`."""
    rope = dict(
        rope_type="yarn",
        rope_theta=150000.0,
        factor=4.0,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=256,
    )
    shape = dict(
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=20,
        num_local_experts=8,
        num_experts_per_tok=2,
        intermediate_size=32,
        rope_parameters=rope,
    )
    return save_moe(path, GptOssConfig, GptOssForCausalLM, **{**shape, **fields})


# what gpt-oss's published config.json leaves in full precision
GPT_OSS_UNQUANTIZED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def save_gpt_oss_mxfp4(model_dir: str, path) -> str:
    """The gpt-oss of `model_dir` with its experts quantized to MXFP4 and stored as the published checkpoints
    store them: per layer `mlp.experts.gate_up_proj_blocks` [experts, 2 * I, hidden / 32, 16] (gate and up
    rows interleaved) and `_scales` [experts, 2 * I, hidden / 32], `down_proj_blocks` [experts, hidden, I / 32,
    16] and `_scales`, the biases as they were; config.json says quant_method "mxfp4"."""
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        packed, scales = quantize(tensors.pop(name).transpose(1, 2))  # outputs first: [experts, out, in / 2]
        tensors[f"{name}_blocks"] = packed.unflatten(-1, (-1, BLOCK // 2)).contiguous()
        tensors[f"{name}_scales"] = scales.contiguous()
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": GPT_OSS_UNQUANTIZED}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_tiny_tokenizer(path)
    return str(path)


def save_stacked(model_dir: str, path) -> str:
    """The model of `model_dir` saved again as transformers 5 holds it: each layer's experts stacked in
    two tensors, gate|up [experts, 2 * width, hidden] and down [experts, hidden, width]."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.save_pretrained(path, save_original_format=False)
    save_tiny_tokenizer(path)
    return str(path)


def tensor_names(model_dir: str) -> list[str]:
    """The names of the tensors in `model_dir`'s model.safetensors."""
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        return list(f.keys())
