"""A tiny random Qwen3-Next model saved with transformers: Gated DeltaNet and gated full-attention layers,
experts with a shared expert in all but one layer, which keeps a dense MLP, and a random multi-token-prediction
layer (`mtp_layers.add_mtp_layer`)."""

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from helpers.mtp_layers import add_mtp_layer
from helpers.qwen3_5_models import FIELDS, randomize
from helpers.tiny_models import save_tiny_tokenizer

LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
DENSE_LAYER = 2  # a Gated DeltaNet layer whose MLP is dense (mlp_only_layers)
# Qwen3.5's tiny sizes (two key heads, each read by two value heads) with eight experts of width 32, top-2, a
# shared expert as wide, and the chosen experts' weights left as the softmax gives them
FIELDS = dict(
    FIELDS,
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    norm_topk_prob=False,
    mlp_only_layers=[DENSE_LAYER],
)


def save_qwen3_next(path, **fields) -> str:
    """Qwen3NextForCausalLM of FIELDS and `fields` in fp32, its norms and dt_bias drawn at random, with the tiny
    tokenizer and an MTP layer."""
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**{**FIELDS, **fields}))
    randomize(model)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    add_mtp_layer(path)
    return str(path)
