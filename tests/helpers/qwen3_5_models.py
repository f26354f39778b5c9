"""Tiny random Qwen3.5 models saved with transformers: three Gated DeltaNet layers to one gated
full-attention layer, twice, dense and with experts, each as a text model and as an image-text checkpoint,
each with a random multi-token-prediction layer (`mtp_layers.add_mtp_layer`)."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
)

from helpers.mtp_layers import add_mtp_layer
from helpers.tiny_models import save_tiny_tokenizer, tiny_config

LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 2
FIELDS = dict(
    tiny_config(),
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    # two key heads, each read by two value heads: the grouping and a two-rank split both show
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)
# FIELDS with experts in every layer's place of the MLP: eight of width 32, top-2, and a shared expert as wide,
# as the published models have it (it then runs in the experts' last slot)
MOE_FIELDS = dict(
    FIELDS, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
)
# a shared expert wider than the routed ones, which runs as a module of its own
WIDER_SHARED_EXPERT = dict(shared_expert_intermediate_size=48)
IMAGE_TEXT_TOKENS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def randomize(model: torch.nn.Module) -> None:
    """Norm weights and dt_bias drawn at random: transformers starts the decoder's norms at 0 (a scale of
    1 + 0), the Gated DeltaNet's own at 1 and dt_bias at 1, which would hide a norm read with the wrong offset
    or a per-head parameter given to the wrong head."""
    for name, parameter in model.named_parameters():
        if name.endswith("linear_attn.norm.weight"):
            parameter.data.uniform_(0.5, 1.5)
        elif name.endswith("norm.weight"):
            parameter.data.normal_(0.0, 0.3)
        elif name.endswith("dt_bias"):
            parameter.data.uniform_(-1.0, 1.0)


def _save(model: torch.nn.Module, path) -> str:
    randomize(model)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    add_mtp_layer(path)
    return str(path)


def save_qwen3_5(path, **fields) -> str:
    """The text model (Qwen3_5ForCausalLM) of FIELDS and `fields`."""
    torch.manual_seed(0)
    return _save(Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**FIELDS, **fields})), path)


def save_repeating_qwen3_5(path) -> str:
    """`save_qwen3_5` with its layers' outputs scaled by a quarter and its LM head the embeddings: its greedy
    tokens repeat their input a few times, in runs whose ends the states decide, so that drafts are kept at
    times (the random model's never are)."""
    save_qwen3_5(path)
    file = Path(path) / "model.safetensors"  # the decoder's weights (the MTP layer's have a file of their own)
    weights = load_file(file)
    for name, weight in weights.items():
        if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
            weight.mul_(0.25)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, file, metadata={"format": "pt"})
    return str(path)


def _image_text_config(config_class, text_fields: dict):
    """An image-text config of `text_fields` with a tiny vision tower, which the engine does not load."""
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=14)
    special = {name: FIELDS["vocab_size"] - 1 - i for i, name in enumerate(IMAGE_TEXT_TOKENS)}
    return config_class(text_config=text_fields, vision_config=vision, **special)


def save_qwen3_5_image_text(path) -> str:
    """An image-text checkpoint of FIELDS' text model with a tiny vision tower."""
    torch.manual_seed(1)
    return _save(Qwen3_5ForConditionalGeneration(_image_text_config(Qwen3_5Config, FIELDS)), path)


def save_qwen3_5_moe(path, **fields) -> str:
    """The mixture-of-experts text model (Qwen3_5MoeForCausalLM) of MOE_FIELDS and `fields`."""
    torch.manual_seed(0)
    return _save(Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**{**MOE_FIELDS, **fields})), path)


def save_qwen3_5_moe_image_text(path) -> str:
    """An image-text checkpoint of MOE_FIELDS' text model with a tiny vision tower."""
    torch.manual_seed(1)
    return _save(Qwen3_5MoeForConditionalGeneration(_image_text_config(Qwen3_5MoeConfig, MOE_FIELDS)), path)
